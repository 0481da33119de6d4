"""What acts in the loop: an :class:`Actor` (a policy with its actions checked), the parameter sync
between learner and policy (:class:`VariableClient`), per-lane episode statistics, and evaluation."""

from __future__ import annotations

import inspect
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from rlflow import specs as _specs
from rlflow.core import Learner, Policy
from rlflow.replay.sample import map_structure
from rlflow.specs import Spec, SpecError

if TYPE_CHECKING:
    from rlflow.environment import Environment

__all__ = ["Actor", "EpisodeStats", "VariableClient", "evaluate"]


class VariableClient:
    """Copies the learner's parameters into a policy every ``period`` env steps.

    ``update(env_steps)`` pulls when at least ``period`` env steps passed since the last pull, so the
    policy acts with parameters at most ``period - 1`` env steps (of lanes' steps) old; ``period=1``
    pulls after every env step. A larger period is the seed design's "policy delayer": actors that
    deliberately lag the learner.
    """

    def __init__(self, source: Learner, policy: Policy, period: int = 1) -> None:
        if int(period) < 1:
            raise ValueError(f"period: expected an integer >= 1 env steps, got {period!r}")
        self.source, self.policy, self.period = source, policy, int(period)
        self._last: int | None = None

    def update(self, env_steps: int, *, force: bool = False) -> bool:
        """Pull the parameters if due (or ``force``); whether it pulled."""
        if not force and self._last is not None and env_steps - self._last < self.period:
            return False
        self.policy.set_params(self.source.get_params())
        self._last = env_steps
        return True

    def state_dict(self) -> dict[str, int | None]:
        """The env step of the last pull (what a run checkpoint keeps of the client)."""
        return {"last_pull": self._last}

    def resume(self, state: dict[str, Any] | None, env_steps: int, *, policy_restored: bool) -> bool:
        """Continue the pull schedule of a run checkpointed at ``env_steps`` (``state`` from
        :meth:`state_dict`, None if the checkpoint has none); whether it pulled.

        The restored learner's parameters are those of the checkpoint's step, the policy's those of its
        last pull. So the policy pulls at once when its last pull was at the checkpoint's step (the same
        parameters again), or when it restored no state (``policy_restored`` False: it has no other
        parameters to act with; acting then differs from the uninterrupted run until its next pull).
        Otherwise it keeps the parameters it restored and pulls when ``period`` env steps have passed
        since its last pull, as the uninterrupted run does.
        """
        last = None if state is None else state.get("last_pull")
        self._last = None if last is None else int(last)
        return self.update(env_steps, force=self._last == env_steps or not policy_restored)


class EpisodeStats:
    """Per-lane return and length of the episodes in progress; hands out those that end.

    :meth:`update` takes each env step's TimeStep. A lane counts the step (its reward, summed over agents
    when it has several, and one more step) unless it is a lone ``first`` (a reset: no action belongs to
    it); a lane that is ``last`` hands out its episode's ``(return, length)`` and starts over at 0. Returns
    add up in float64. ``returns`` and ``lengths`` (``[E]`` float64 and int64) are the episodes in
    progress; :meth:`reset` starts every lane over (a run restarting its envs).

    An env may split a game into several episodes (:class:`~rlflow.envs.EpisodicLife`: an episode a life): a
    ``last`` lane whose info marks ``game_over`` False (in ``info["final_info"]``, where a vector env moved the
    ending step's info, else in ``info``) goes on counting into its next episode, so what is handed out is
    whole games. Lanes whose env marks nothing hand out each episode.

    A few vector operations per step: a step with no ``first`` and no ``last`` lane adds the rewards to
    the returns; the lengths are the steps counted since each lane's episode began (``steps - begun``),
    so they change only at the lanes' boundaries."""

    def __init__(self, num_lanes: int) -> None:
        self._returns = np.zeros(num_lanes, np.float64)
        self._begun = np.zeros(num_lanes, np.int64)  # the value of _steps when each lane's episode had 0 steps
        self._steps = 0  # update() calls

    @property
    def returns(self) -> np.ndarray:
        """The return of each lane's episode in progress (a copy)."""
        return self._returns.copy()

    @property
    def lengths(self) -> np.ndarray:
        """The length of each lane's episode in progress (a copy)."""
        return self._steps - self._begun

    def reset(self) -> None:
        """Forget the episodes in progress: every lane starts over at return 0, length 0."""
        self._returns[:] = 0.0
        self._begun[:] = self._steps

    def state_dict(self) -> dict[str, np.ndarray]:
        """The episodes in progress (restore with :meth:`load_state_dict`)."""
        return {"returns": self.returns, "lengths": self.lengths}

    def load_state_dict(self, state: Any) -> None:
        """Continue the episodes of :meth:`state_dict`'s output (one return and one length per lane)."""
        returns, lengths = np.asarray(state["returns"], np.float64), np.asarray(state["lengths"], np.int64)
        if returns.shape != self._returns.shape or lengths.shape != self._begun.shape:
            raise ValueError(f"episode statistics: expected {self._returns.size} lanes, got returns {returns.shape} "
                             f"and lengths {lengths.shape}")
        self._returns[:] = returns
        self._begun[:] = self._steps - lengths

    def update(self, timestep: Any) -> list[tuple[float, int]]:
        """Count one step of every lane that acted; ``(return, length)`` of each episode that ended, in lane
        order."""
        reward, first, last = np.asarray(timestep.reward), timestep.first, timestep.last
        if reward.ndim > 1:  # several rewards per lane (e.g. per agent): their sum
            reward = reward.reshape(len(reward), -1).sum(axis=1, dtype=np.float64)
        self._steps += 1
        if not np.count_nonzero(first) and not np.count_nonzero(last):  # every lane goes on
            self._returns = self._returns + reward  # (a new array: numpy adds one lane in place slower)
            return []
        first, last = np.asarray(first, np.bool_), np.asarray(last, np.bool_)
        acted = last | ~first
        np.add(self._returns, reward, out=self._returns, where=acted)
        self._begun[~acted] += 1  # a lone reset: the lane's episode (of 0 steps) does not grow
        if not np.count_nonzero(last):
            return []
        last = last & ~_game_goes_on(timestep.info, len(last))
        ended = list(zip(self._returns[last].tolist(), (self._steps - self._begun[last]).tolist(), strict=True))
        self._returns[last] = 0.0
        self._begun[last] = self._steps
        return ended


def _game_goes_on(info: Any, num_lanes: int) -> np.ndarray:
    """``[E]`` bool: the lanes whose ending step's info marks ``game_over`` False (``EpisodicLife``): in
    ``info["final_info"]`` where a vector env moved it there (same-step autoreset), else in ``info``; a
    gymnasium vector env batches a key into an array with its ``_key`` mask (lanes without it: False)."""
    none = np.zeros(num_lanes, np.bool_)
    if not isinstance(info, dict):
        return none
    source = info.get("final_info", info)
    if not isinstance(source, dict) or "game_over" not in source:
        return none
    over = np.asarray(source["game_over"])
    marked = np.asarray(source.get("_game_over", np.ones(num_lanes, np.bool_)), np.bool_)
    if over.shape != (num_lanes,) or marked.shape != (num_lanes,):
        return none
    return marked & ~over.astype(np.bool_)


class Actor:
    """A policy acting on a batched env, its actions checked against the env's action spec.

    ``select_action`` raises :class:`~rlflow.specs.SpecError` naming the policy's output and the action
    space when the actions do not match (shape, dtype, bounds). Torch tensors among the actions and the
    extras (CPU or GPU, nested in dicts, tuples and lists as the spaces are) come back as numpy arrays.
    """

    def __init__(self, policy: Policy, action_spec: Spec, num_lanes: int, action_space: Any = None) -> None:
        self.policy = policy
        self.num_lanes = int(num_lanes)
        self._action_spec = action_spec
        self._action_fields = _specs.flatten_spec({"action": action_spec})
        self._simple = action_spec if isinstance(action_spec, _specs.Field) else None
        self._space = action_space
        _check_act_signature(policy)
        self.state = policy.initial_state(self.num_lanes)

    def reset(self) -> None:
        self.state = self.policy.initial_state(self.num_lanes)

    def state_dict(self) -> dict[str, Any]:
        """The policy's recurrent state (leaves as they are; NamedTuples as tuples), for a run checkpoint."""
        return {"state": _plain_state(self.state)}

    def check_state(self, state: Any) -> None:
        """Raise :class:`~rlflow.replay.checkpoint.CheckpointError` if :meth:`load_state_dict` would refuse
        ``state`` (a recurrent state in another nesting than ``policy.initial_state``'s); changes nothing."""
        from rlflow.replay.checkpoint import CheckpointError

        try:
            _like_state(self.policy.initial_state(self.num_lanes), state["state"], "state")
        except ValueError as exc:
            raise CheckpointError(f"actor state: {exc}; resume with the policy the checkpointed run had") from None

    def load_state_dict(self, state: Any) -> None:
        """Restore :meth:`state_dict`'s output, in the nesting of ``policy.initial_state`` (tensors on its
        leaves' devices)."""
        self.state = _like_state(self.policy.initial_state(self.num_lanes), state["state"], "state")

    def select_action(self, observation: Any, *, evaluation: bool = False, first: Any = None) -> tuple[Any, Any]:
        """The policy's actions (checked) and extras; lanes marked in ``first`` (``[E]`` bool: their
        observation starts an episode) get the policy's initial state first."""
        if first is not None and self.state is not None and np.any(first):
            self.state = _reset_rows(self.state, self.policy.initial_state(self.num_lanes), np.asarray(first))
        out = self.policy.act(observation, self.state, evaluation=evaluation)
        if not (isinstance(out, tuple) and len(out) == 3):
            raise TypeError(f"{type(self.policy).__name__}.act returned {type(out).__name__}: expected a tuple "
                            "(actions, extras, state)")
        actions, extras, self.state = out
        if extras is not None:
            extras = _numpy_leaves(extras, self.policy, "extras")
        if self._simple is not None and _specs.fits(self._simple, actions, self.num_lanes):
            return actions, extras
        actions = _numpy_leaves(actions, self.policy, "actions")
        try:
            flat = _specs.flatten_data({"action": self._action_spec}, {"action": actions})
            _specs.validate(self._action_fields, flat, (self.num_lanes,))
        except SpecError as exc:
            space = self._space if self._space is not None else self._action_spec
            raise SpecError(f"{type(self.policy).__name__}.act returned actions that do not fit the action space "
                            f"{space} for {self.num_lanes} lanes: {exc}") from None
        return actions, extras


def _numpy_leaves(value: Any, policy: Policy, what: str) -> Any:
    """``value`` (a policy's actions or extras) with every torch tensor leaf, on any device, as a numpy array
    (detached and copied to the CPU), nested as it came. Raises TypeError naming the policy for a tensor
    that has no values to copy (e.g. on the ``meta`` device)."""
    torch = sys.modules.get("torch")
    if torch is None:  # no tensor exists before torch is imported
        return value

    def convert(leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor):
            return leaf
        try:
            return leaf.detach().cpu().numpy()
        except (RuntimeError, NotImplementedError, TypeError) as exc:
            raise TypeError(f"{type(policy).__name__}.act returned {what} as a torch tensor on device "
                            f"{leaf.device} whose values cannot be copied to numpy ({exc}); return numpy arrays "
                            "or tensors on the CPU or a GPU") from None

    return map_structure(convert, value)


def _reset_rows(state: Any, initial: Any, first: np.ndarray) -> Any:
    """``state`` with the rows of the ``first`` lanes taken from ``initial`` (same nesting, leaves ``[E, ...]``)."""
    if state is None:
        return None
    if isinstance(state, dict):
        return {k: _reset_rows(v, initial[k], first) for k, v in state.items()}
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # a NamedTuple
        return type(state)(*(_reset_rows(v, i, first) for v, i in zip(state, initial, strict=True)))
    if isinstance(state, tuple | list):
        return type(state)(_reset_rows(v, i, first) for v, i in zip(state, initial, strict=True))
    if tuple(state.shape[:1]) != first.shape:
        raise ValueError(f"a recurrent state leaf of shape {tuple(state.shape)}: expected the lanes first, "
                         f"[{first.shape[0]}, ...] (e.g. nn.GRU's [layers, E, H] moved to [E, layers, H])")
    if isinstance(state, np.ndarray):
        out = state.copy()
        out[first] = np.asarray(initial)[first]
        return out
    import torch  # a tensor: the mask on its device

    mask = torch.tensor(first, device=state.device)  # a copy: ``first`` may be a read-only view of the env's flags
    return torch.where(mask.reshape(-1, *([1] * (state.dim() - 1))), initial.to(state.device), state)


def _check_act_signature(policy: Policy) -> None:
    """Refuse a policy whose ``act`` cannot be called as the actor calls it: ``act(observation, state,
    evaluation=...)``."""
    try:
        signature = inspect.signature(policy.act)
    except (TypeError, ValueError):  # a builtin or C callable: left to the call itself
        return
    try:
        signature.bind(None, None, evaluation=False)
    except TypeError:
        raise TypeError(f"{type(policy).__name__}.act{signature}: expected act(self, observation, state, *, "
                        "evaluation=False), the signature of rlflow.Policy.act (rlflow passes evaluation=True for "
                        "evaluation episodes: act greedily then)") from None


def _plain_state(state: Any) -> Any:
    """A recurrent state with its NamedTuples as tuples (a checkpoint loads no classes)."""
    if isinstance(state, dict):
        return {k: _plain_state(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_plain_state(v) for v in state]
    if isinstance(state, tuple):  # NamedTuples too
        return tuple(_plain_state(v) for v in state)
    return state


def _like_state(initial: Any, saved: Any, where: str) -> Any:
    """``saved`` in the nesting of ``initial`` (its NamedTuple types, its tensors' devices)."""
    if initial is None or saved is None:
        if (initial is None) != (saved is None):
            raise ValueError(f"recurrent {where}: the policy's initial_state is {type(initial).__name__}, the "
                             f"checkpoint's state {type(saved).__name__}")
        return None
    if isinstance(initial, dict):
        if not isinstance(saved, dict) or set(saved) != set(initial):
            raise ValueError(f"recurrent {where}: expected the keys {sorted(initial)}, got {type(saved).__name__} "
                             f"{sorted(saved) if isinstance(saved, dict) else ''}")
        return {k: _like_state(v, saved[k], f"{where}[{k!r}]") for k, v in initial.items()}
    if isinstance(initial, tuple | list):
        if not isinstance(saved, tuple | list) or len(saved) != len(initial):
            raise ValueError(f"recurrent {where}: expected {len(initial)} parts, got {type(saved).__name__}")
        parts = [_like_state(i, s, f"{where}[{n}]") for n, (i, s) in enumerate(zip(initial, saved, strict=True))]
        return type(initial)(*parts) if hasattr(initial, "_fields") else type(initial)(parts)
    if isinstance(initial, np.ndarray):
        return np.asarray(saved, initial.dtype).copy()
    if hasattr(initial, "device") and hasattr(saved, "to"):  # a torch tensor
        return saved.to(initial.device)
    return saved


def evaluate(env: Environment, policy: Policy, episodes: int, *, seed: int | None = None) -> list[float]:
    """Returns of ``episodes`` whole episodes with ``policy.act(..., evaluation=True)`` (nothing stored).

    All lanes of ``env`` run until ``episodes`` episodes ended; the first ``episodes`` to end count.
    """
    from rlflow.loop.checks import check_env

    check_env(env, "env", "rlflow.evaluate")
    actor = Actor(policy, env.action_spec, env.num_envs, env.single_action_space)
    stats = EpisodeStats(env.num_envs)
    ts = env.reset(seed=seed)
    done: list[float] = []
    while len(done) < episodes:
        actions, _ = actor.select_action(ts.observation, evaluation=True, first=ts.first)
        ts = env.step(actions)
        done.extend(r for r, _ in stats.update(ts))
    return done[:episodes]
