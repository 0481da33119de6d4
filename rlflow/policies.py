"""Policies a user can take as they are: epsilon-greedy acting in a Q-network's values.

Importing this module imports torch (``import rlflow`` does not import it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from rlflow.core import Policy

__all__ = ["EpsilonGreedy"]


class EpsilonGreedy(Policy):
    """Acts greedily in a Q-network's values with probability ``1 - epsilon``, uniformly at random otherwise.

    ``epsilon`` falls linearly from ``start`` to ``end`` over the first ``decay_steps`` acting steps (counted
    per lane: a call for ``E`` lanes counts ``E``), then stays at ``end``; evaluation (``evaluation=True``)
    is greedy and counts no step. The network takes a batch of observations ``[E, ...]`` on its own
    device and returns one value per action ``[E, num_actions]``; it runs only when some lane acts
    greedily. :meth:`set_params` replaces it (in one process, give the learner's network itself: the policy
    then acts with every update at once). The step count and the random generator are its state.

    Args:
        q: the Q-network.
        num_actions: the number of discrete actions (actions are ``0 .. num_actions - 1``).
        decay_steps: acting steps over which epsilon falls from ``start`` to ``end``.
        start: the first steps' epsilon.
        end: epsilon after ``decay_steps``.
        seed: the seed of the exploration's random numbers.
    """

    def __init__(self, q: nn.Module, num_actions: int, *, decay_steps: int, start: float = 1.0, end: float = 0.05,
                 seed: int | None = None) -> None:
        if int(num_actions) < 1 or int(decay_steps) < 1:
            raise ValueError(f"num_actions and decay_steps: expected integers >= 1, got {num_actions} and "
                             f"{decay_steps}")
        if not (0.0 <= end <= 1.0 and 0.0 <= start <= 1.0):
            raise ValueError(f"start and end: expected probabilities in [0, 1], got {start} and {end}")
        self.q = q
        self.num_actions = int(num_actions)
        self.decay_steps = int(decay_steps)
        self.start, self.end = float(start), float(end)
        self.steps = 0
        self.rng = np.random.default_rng(seed)

    @property
    def epsilon(self) -> float:
        """The probability of a random action at the current step."""
        return self.start + min(1.0, self.steps / self.decay_steps) * (self.end - self.start)

    def act(self, observation: Any, state: Any, *, evaluation: bool = False) -> tuple[np.ndarray, None, Any]:
        n = len(observation)
        u = self.rng.random(2 * n)  # one draw for both choices (Generator.integers costs several times more)
        explore = np.zeros(n, bool) if evaluation else u[:n] < self.epsilon
        actions = (u[n:] * self.num_actions).astype(np.int64)
        if not explore.all():  # the network runs only when some lane acts greedily
            with torch.inference_mode():  # the observations to the network's device, the actions back
                device = next(self.q.parameters()).device
                greedy = self.q(torch.as_tensor(observation, device=device)).argmax(dim=1).cpu().numpy()
            actions = np.where(explore, actions, greedy)
        if not evaluation:
            self.steps += n
        return actions, None, state

    def set_params(self, params: Any) -> None:
        """Act with the network ``params`` from now on (None, a learner's default: keep the network)."""
        if params is not None:
            self.q = params

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng"]  # a bad state raises here, before anything changes
        self.steps = int(state["steps"])
        self.rng = rng
