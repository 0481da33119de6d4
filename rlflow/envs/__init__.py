"""Environment wrappers: gymnasium envs and vector envs as streams of batched TimeSteps (one lane per env).

Importing this package imports gymnasium.
"""

from rlflow.envs.gymnasium import GymEnvironment, make, to_autoreset_mode

__all__ = ["GymEnvironment", "make", "to_autoreset_mode"]
