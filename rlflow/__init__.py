"""rlflow: the data flow of reinforcement learning, from environment steps to learner batches.

Import-light: ``import rlflow`` needs only numpy; torch, gymnasium and pettingzoo are imported by the
parts that use them.
"""

from rlflow import specs

__version__ = "0.1.0"

__all__ = ["__version__", "specs"]
