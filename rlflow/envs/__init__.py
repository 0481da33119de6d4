"""Environment wrappers: gymnasium envs and vector envs, and PettingZoo parallel envs, as streams of batched
TimeSteps (one lane per env), and PettingZoo turn-based (AEC) envs as one lane per (env, agent).

Importing this package imports gymnasium (PettingZoo is imported only by the PettingZoo wrappers' users).
"""

from rlflow.envs.aec import AECEnvironment, Turn
from rlflow.envs.atari import EpisodicLife, FireReset, atari, atari_env
from rlflow.envs.groups import make_groups
from rlflow.envs.gymnasium import GymEnvironment, make, to_autoreset_mode, worker_ignoring_sigint
from rlflow.envs.pettingzoo import ParallelEnvironment

__all__ = ["AECEnvironment", "EpisodicLife", "FireReset", "GymEnvironment", "ParallelEnvironment", "Turn", "atari",
           "atari_env", "make", "make_groups", "to_autoreset_mode", "worker_ignoring_sigint"]
