"""rlflow: the data flow of reinforcement learning, from environment steps to learner batches.

Import-light: ``import rlflow`` needs only numpy; torch, gymnasium, pettingzoo, tqdm and matplotlib are
imported by the parts that use them.
"""

from rlflow import specs
from rlflow.buffer import ReplayBuffer
from rlflow.core import Learner, LearnerUpdate, Policy
from rlflow.environment import Environment
from rlflow.loop import Actor, RunConfig, RunResult, VariableClient, evaluate, load, run, save
from rlflow.plots import plot_run

__version__ = "0.1.0"

__all__ = [
    "Actor",
    "Environment",
    "Learner",
    "LearnerUpdate",
    "Policy",
    "ReplayBuffer",
    "RunConfig",
    "RunResult",
    "VariableClient",
    "__version__",
    "evaluate",
    "load",
    "plot_run",
    "run",
    "save",
    "specs",
]
