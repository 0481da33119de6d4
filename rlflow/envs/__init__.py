"""Environment wrappers: gymnasium envs and vector envs, and PettingZoo parallel envs, as streams of batched
TimeSteps (one lane per env).

Importing this package imports gymnasium (PettingZoo is imported only by the PettingZoo wrappers' users).
"""

from rlflow.envs.gymnasium import GymEnvironment, make, to_autoreset_mode
from rlflow.envs.pettingzoo import ParallelEnvironment

__all__ = ["GymEnvironment", "ParallelEnvironment", "make", "to_autoreset_mode"]
