"""Returns, n-step targets, GAE and value normalisation for on-policy rollouts.

Every function takes time-major arrays ``[T, E, ...]`` (time, envs, then e.g. an agent axis ``[A]`` or
nothing), as numpy arrays or torch tensors: with any torch tensor among the inputs the computation runs
in torch, on that tensor's device, in the inputs' floating dtype; otherwise in numpy. Inputs must have
the same number of axes and the same ``T``; other axes of size 1 broadcast (a team flag ``[T, E, 1]``
against per-agent rewards ``[T, E, A]``). The result has the broadcast shape.

The boundary model (the adders' too): step ``t`` has reward ``r_t``, received after action ``a_t`` in
state ``s_t``. ``terminated[t]`` means ``s_{t+1}`` is terminal (no future: its value is 0);
``truncated[t]`` means the episode was cut after step ``t`` and ``s_{t+1}`` is its true final observation
(bootstrap from its value). ``next_values[t] = V(s_{t+1})``, the true next observation, never the reset
observation of the next episode. After ``terminated[t] | truncated[t]`` the lane's next episode starts
at ``t + 1``; where both flags are set, termination wins. The rollout's last step ``T - 1`` without a
flag bootstraps like a truncation.

Flags are read with ``where``, never multiplied in, so a NaN in ``next_values`` at a terminated step does
not reach the result. The functions compute targets; they are not meant to be differentiated through.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = [
    "ValueNormalizer",
    "discounted_returns",
    "gae",
    "lambda_returns",
    "next_values_from",
    "normalize_advantages",
    "nstep_returns",
    "nstep_targets",
]

Array = Any  # a numpy array or a torch tensor


def _backend(arrays: list[Any]) -> tuple[Any, Any]:
    """(module, device): torch and the first tensor's device if any input is a tensor, else numpy."""
    torch = sys.modules.get("torch")
    if torch is not None:
        for a in arrays:
            if isinstance(a, torch.Tensor):
                return torch, a.device
    return np, None


def _floats(xp: Any, device: Any, values: list[Any]) -> list[Any]:
    """The values as arrays of xp in their common floating dtype (float64 / torch's default if none is)."""
    if xp is np:
        arrays = [np.asarray(v) for v in values]
        dtype = np.result_type(*arrays)
        dtype = dtype if dtype.kind == "f" else np.dtype(np.float64)
        return [a.astype(dtype, copy=False) for a in arrays]
    tensors = [xp.as_tensor(v, device=device) for v in values]
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = xp.promote_types(dtype, t.dtype)
    dtype = dtype if dtype.is_floating_point else xp.get_default_dtype()
    return [t.to(dtype) for t in tensors]


def _flags(xp: Any, device: Any, values: list[Any]) -> list[Any]:
    out = []
    for v in values:
        a = np.asarray(v) if xp is np else xp.as_tensor(v, device=device)
        out.append(a if a.dtype == (np.bool_ if xp is np else xp.bool) else a != 0)
    return out


def _time_major_shape(named: dict[str, Any]) -> tuple[int, ...]:
    """The broadcast shape of time-major arrays, checking that they agree on T and on their axes."""
    (first_name, first), *_ = named.items()
    if first.ndim < 1:
        raise ValueError(f"{first_name}: expected a time-major array [T, E, ...], got a scalar")
    shape = list(first.shape)
    for name, a in named.items():
        if a.ndim != first.ndim or a.shape[0] != first.shape[0]:
            raise ValueError(
                f"{name}: expected shape [T={first.shape[0]}, ...] with {first.ndim} axes like {first_name} "
                f"{tuple(first.shape)}, got {tuple(a.shape)} (add size-1 axes, e.g. x[..., None], to broadcast)"
            )
        for i, n in enumerate(a.shape):
            if n != shape[i] and 1 not in (n, shape[i]):
                raise ValueError(f"{name}: shape {tuple(a.shape)} does not broadcast with {first_name} "
                                 f"{tuple(first.shape)} (axis {i}: {n} vs {shape[i]})")
            shape[i] = max(shape[i], n)
    return tuple(shape)


def _prepare(floats: dict[str, Any], flags: dict[str, Any]) -> tuple[Any, list[Any], list[Any]]:
    """Convert, check and broadcast the inputs of a return function: (xp, float arrays, bool arrays)."""
    xp, device = _backend([*floats.values(), *flags.values()])
    f = _floats(xp, device, list(floats.values()))
    b = _flags(xp, device, list(flags.values()))
    shape = _time_major_shape(dict(zip([*floats, *flags], [*f, *b], strict=True)))
    return xp, [xp.broadcast_to(a, shape) for a in f], [xp.broadcast_to(a, shape) for a in b]


def _check_unit(name: str, value: float) -> float:
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name}: expected a number in [0, 1], got {value}")
    return float(value)


def discounted_returns(
    rewards: Array, terminated: Array, truncated: Array, discount: float, next_values: Array | None = None
) -> Array:
    """The discounted return of every step within its episode.

    ``G_t = r_t + discount * tail_t`` with ``tail_t = 0`` if ``terminated[t]``; ``next_values[t]`` (0 when
    not given) if ``truncated[t]`` or ``t = T - 1``; else ``G_{t+1}``.

    Args:
        rewards: ``[T, E, ...]``.
        terminated: ``[T, E, ...]`` bool (or 0/1), broadcastable to the rewards.
        truncated: like ``terminated``.
        discount: in ``[0, 1]``.
        next_values: ``[T, E, ...]``, ``V(s_{t+1})``; read only at truncations and at ``T - 1``.

    Returns:
        ``[T, E, ...]`` returns.
    """
    g = _check_unit("discount", discount)
    floats = {"rewards": rewards} if next_values is None else {"rewards": rewards, "next_values": next_values}
    xp, f, (term, trunc) = _prepare(floats, {"terminated": terminated, "truncated": truncated})
    r = f[0]
    zero = xp.zeros_like(r[0])
    boot = f[1] if next_values is not None else xp.zeros_like(r)
    out = []
    ret = boot[-1]
    for t in range(r.shape[0] - 1, -1, -1):
        tail = xp.where(trunc[t], boot[t], ret)
        ret = r[t] + g * xp.where(term[t], zero, tail)
        out.append(ret)
    return xp.stack(out[::-1])


def _nstep(
    rewards: Array, next_values: Array | None, terminated: Array, truncated: Array, discount: float, n: int
) -> tuple[Array, Array, Array, Array | None]:
    """(returns, discounts, steps, bootstrap values or None): one loop over the window offset j < n."""
    g = _check_unit("discount", discount)
    if int(n) != n or n < 1:
        raise ValueError(f"n: expected an integer >= 1, got {n}")
    floats = {"rewards": rewards} if next_values is None else {"rewards": rewards, "next_values": next_values}
    xp, f, (term, trunc) = _prepare(floats, {"terminated": terminated, "truncated": truncated})
    r = f[0]
    T = r.shape[0]
    ret, steps, zero = xp.zeros_like(r), xp.zeros_like(r), xp.zeros_like(r)
    end_term = xp.zeros_like(term)
    is_open = xp.ones_like(term)  # is_open[t]: the window starting at t has not met an end flag yet
    boot = xp.zeros_like(r) if next_values is not None else None
    for j in range(min(int(n), T)):
        m = T - j  # windows starting at t < m can reach step t + j
        o = is_open[:m]
        ret[:m] += xp.where(o, r[j:], zero[:m]) * g**j
        steps[:m] += o
        end_term[:m] = xp.where(o, term[j:], end_term[:m])
        if boot is not None:
            boot[:m] = xp.where(o, f[1][j:], boot[:m])
        is_open[:m] = o & ~(term[j:] | trunc[j:])
    discounts = xp.where(end_term, zero, g**steps)
    return ret, discounts, steps, boot


def nstep_returns(
    rewards: Array, terminated: Array, truncated: Array, discount: float, n: int
) -> tuple[Array, Array, Array]:
    """N-step returns in the adders' ``(return, discount)`` form, with the window lengths.

    The window from step ``t`` has ``k_t = min(n, steps to the episode's end, T - t)`` steps, the episode
    ending at the first ``terminated | truncated`` step. ``returns_t = sum_{j<k} discount^j r_{t+j}``;
    ``discounts_t = 0`` if step ``t + k - 1`` is terminated, else ``discount^k``. The target is
    ``returns_t + discounts_t * V(s_{t+k})``, and ``V(s_{t+k}) = next_values[t + k - 1]``.

    Returns:
        ``(returns, discounts, steps)``, each ``[T, E, ...]``; ``steps`` (``k``) is int64.
    """
    ret, discounts, steps, _ = _nstep(rewards, None, terminated, truncated, discount, n)
    return ret, discounts, steps.astype(np.int64) if isinstance(steps, np.ndarray) else steps.long()


def nstep_targets(
    rewards: Array, next_values: Array, terminated: Array, truncated: Array, discount: float, n: int
) -> Array:
    """N-step TD targets ``returns_t + discounts_t * next_values[t + k_t - 1]`` (see :func:`nstep_returns`).

    ``n = 1`` gives the one-step target ``r_t + discount * V(s_{t+1})`` (``r_t`` on termination).
    """
    ret, discounts, _, boot = _nstep(rewards, next_values, terminated, truncated, discount, n)
    xp, _ = _backend([ret])
    return ret + xp.where(discounts == 0, xp.zeros_like(ret), discounts * boot)


def gae(
    rewards: Array,
    values: Array,
    next_values: Array,
    terminated: Array,
    truncated: Array,
    discount: float,
    lam: float,
) -> tuple[Array, Array]:
    """Generalised advantage estimation with separate termination and truncation.

    ``delta_t = r_t + discount * (0 if terminated[t] else next_values[t]) - values[t]``;
    ``A_t = delta_t + discount * lam * A_{t+1}``, with ``A_{t+1} = 0`` when ``terminated[t] | truncated[t]``
    or ``t = T - 1``. The returns ``A_t + values[t]`` are the lambda-returns (critic targets).
    ``lam = 1`` gives the discounted returns of :func:`discounted_returns` when ``next_values`` agrees with
    ``values`` inside episodes; ``lam = 0`` the one-step targets.

    Returns:
        ``(advantages, returns)``, each ``[T, E, ...]``.
    """
    g = _check_unit("discount", discount)
    gl = g * _check_unit("lam", lam)
    xp, (r, v, nv), (term, trunc) = _prepare(
        {"rewards": rewards, "values": values, "next_values": next_values},
        {"terminated": terminated, "truncated": truncated},
    )
    zero = xp.zeros_like(r[0])
    out = []
    adv = zero
    for t in range(r.shape[0] - 1, -1, -1):
        delta = r[t] + g * xp.where(term[t], zero, nv[t]) - v[t]
        adv = delta + gl * xp.where(term[t] | trunc[t], zero, adv)
        out.append(adv)
    advantages = xp.stack(out[::-1])
    return advantages, advantages + v


def lambda_returns(
    rewards: Array,
    values: Array,
    next_values: Array,
    terminated: Array,
    truncated: Array,
    discount: float,
    lam: float,
) -> Array:
    """The lambda-returns, ``gae(...)[1]`` (see :func:`gae`)."""
    return gae(rewards, values, next_values, terminated, truncated, discount, lam)[1]


def next_values_from(
    values: Array, last_values: Array, terminated: Array, truncated: Array, final_values: Array | None = None
) -> Array:
    """``next_values`` for a standard rollout: ``V(s_{t+1})`` from the values the actor computed.

    ``next_values[t] = values[t + 1]`` inside an episode, ``last_values`` at ``t = T - 1``, and
    ``final_values[t]`` (V of the episode's final observation) where ``terminated[t] | truncated[t]``.
    Without ``final_values`` ended steps get 0, which is right only for terminations: a truncated step
    then raises.

    Args:
        values: ``[T, E, ...]``, V of each step's observation.
        last_values: ``[E, ...]``, V of the observation after the rollout.
        terminated: ``[T, E, ...]`` bool, broadcastable to the values.
        truncated: like ``terminated``.
        final_values: ``[T, E, ...]``, read only where an episode ended.
    """
    floats = {"values": values, "last_values": last_values}
    if final_values is not None:
        floats["final_values"] = final_values
    xp, device = _backend([*floats.values(), terminated, truncated])
    f = dict(zip(floats, _floats(xp, device, list(floats.values())), strict=True))
    term, trunc = _flags(xp, device, [terminated, truncated])
    named = {k: a for k, a in f.items() if k != "last_values"}
    shape = _time_major_shape({**named, "terminated": term, "truncated": trunc})
    last = f["last_values"]
    if last.ndim != len(shape) - 1:
        raise ValueError(f"last_values: expected shape [E, ...] with {len(shape) - 1} axes for values "
                         f"{tuple(f['values'].shape)}, got {tuple(last.shape)}")
    ended = xp.broadcast_to(term | trunc, shape)
    if final_values is None:
        if bool(xp.broadcast_to(trunc & ~term, shape).any()):
            raise ValueError("final_values: expected V of the final observations, got None with truncated steps "
                             "(bootstrapping them from 0 would be wrong)")
        final = xp.zeros(shape, dtype=f["values"].dtype, **({} if xp is np else {"device": device}))
    else:
        final = xp.broadcast_to(f["final_values"], shape)
    v = xp.broadcast_to(f["values"], shape)
    shifted = xp.concatenate([v[1:], xp.broadcast_to(last, shape[1:])[None]])
    return xp.where(ended, final, shifted)


def normalize_advantages(adv: Array, mask: Array | None = None, eps: float = 1e-8) -> Array:
    """``(adv - mean) / (std + eps)`` with the mean and population std over valid entries only.

    Args:
        adv: advantages of any shape.
        mask: bool, broadcastable to ``adv`` with the same number of axes; True marks valid entries.
            Invalid entries do not enter the statistics and come back as 0.
        eps: added to the std.

    Returns:
        The normalised advantages, in ``adv``'s dtype (all 0 when no entry is valid).
    """
    xp, device = _backend([adv, mask])
    (a,) = _floats(xp, device, [adv])
    (m,) = _flags(xp, device, [True if mask is None else mask])
    if mask is not None and m.ndim != a.ndim:
        raise ValueError(f"mask: expected {a.ndim} axes like adv {tuple(a.shape)}, got {tuple(m.shape)}")
    m = xp.broadcast_to(m, a.shape)
    zero = xp.zeros_like(a)
    count = m.sum()
    count = np.maximum(count, 1) if xp is np else count.clamp(min=1)
    mean = xp.where(m, a, zero).sum() / count
    centred = xp.where(m, a - mean, zero)
    std = ((centred * centred).sum() / count) ** 0.5
    return centred / (std + eps)


class ValueNormalizer:
    """Running statistics of value targets, to train a critic on normalised targets (PopArt-free).

    Two modes:

    - ``beta`` in ``(0, 1)`` (default ``0.99999``, as HARL/MAPPO's ValueNorm): per update,
      ``m = beta * m + (1 - beta) * batch_mean``, ``s = beta * s + (1 - beta) * batch_mean_of_squares``,
      ``d = beta * d + (1 - beta)``; ``mean = m / d``, ``var = s / d - mean**2`` (``d = 1 - beta^k`` after
      ``k`` updates debiases the zero start exactly).
    - ``beta=None``: the exact mean and population variance of everything seen (parallel-variance update).

    In both, ``var`` is floored at ``min_var`` (HARL's 1e-2) before use; with no data yet normalisation
    is the identity. Statistics are float64 numpy arrays of shape ``shape``: ``()`` for one statistic,
    ``(A,)`` for one per agent. ``update(x)`` reduces ``x [..., *shape]`` over its leading axes; pass
    only valid entries (``x[mask]`` for ``shape=()``).
    """

    def __init__(
        self, shape: int | tuple[int, ...] = (), beta: float | None = 0.99999, min_var: float = 1e-2
    ) -> None:
        if beta is not None and not 0.0 < beta < 1.0:
            raise ValueError(f"beta: expected a number in (0, 1) or None, got {beta}")
        if not min_var >= 0.0:
            raise ValueError(f"min_var: expected a number >= 0, got {min_var}")
        self.shape = (int(shape),) if isinstance(shape, int) else tuple(int(n) for n in shape)
        self.beta = None if beta is None else float(beta)
        self.min_var = float(min_var)
        self.weight = 0.0  # beta=None: the count; else the debiasing term d
        self._first = np.zeros(self.shape)  # the running mean (beta=None) or m
        self._second = np.zeros(self.shape)  # the running variance (beta=None) or s

    def _check(self, x: Array) -> None:
        n = len(self.shape)
        if x.ndim < n or tuple(x.shape[x.ndim - n:]) != self.shape:
            raise ValueError(f"expected an array [..., {', '.join(map(str, self.shape))}] "
                             f"(trailing shape {self.shape}), got shape {tuple(x.shape)}")

    def update(self, x: Array) -> None:
        """Fold a batch ``[..., *shape]`` (numpy or torch) into the statistics; an empty batch is ignored."""
        xp, _ = _backend([x])
        a = np.asarray(x, np.float64) if xp is np else x.detach().to("cpu", xp.float64).numpy()
        self._check(a)
        a = a.reshape(-1, *self.shape)
        if a.shape[0] == 0:
            return
        batch_mean = a.mean(axis=0)
        if self.beta is None:
            n, total = a.shape[0], self.weight + a.shape[0]
            delta = batch_mean - self._first
            self._second = (self._second * self.weight + a.var(axis=0) * n
                            + delta**2 * self.weight * n / total) / total
            self._first = self._first + delta * n / total
            self.weight = total
        else:
            b = self.beta
            self._first = b * self._first + (1 - b) * batch_mean
            self._second = b * self._second + (1 - b) * (a * a).mean(axis=0)
            self.weight = b * self.weight + (1 - b)

    @property
    def mean(self) -> np.ndarray:
        """The (debiased) running mean, float64 ``shape``; 0 before any data."""
        if self.weight == 0:
            return np.zeros(self.shape)
        return self._first.copy() if self.beta is None else self._first / self.weight

    @property
    def var(self) -> np.ndarray:
        """The running variance floored at ``min_var``, float64 ``shape``; 1 before any data."""
        if self.weight == 0:
            return np.ones(self.shape)
        var = self._second if self.beta is None else self._second / self.weight - self.mean**2
        return np.maximum(var, self.min_var)

    def _stats(self, x: Array) -> tuple[Any, Any, Array]:
        xp, device = _backend([x])
        (a,) = _floats(xp, device, [x])
        self._check(a)
        mean, std = self.mean, np.sqrt(self.var)
        if xp is np:
            return mean.astype(a.dtype), std.astype(a.dtype), a
        return xp.as_tensor(mean, dtype=a.dtype, device=device), xp.as_tensor(std, dtype=a.dtype, device=device), a

    def normalize(self, x: Array) -> Array:
        """``(x - mean) / sqrt(var)``, in ``x``'s type, dtype and device."""
        mean, std, a = self._stats(x)
        return (a - mean) / std

    def denormalize(self, x: Array) -> Array:
        """``x * sqrt(var) + mean``, in ``x``'s type, dtype and device."""
        mean, std, a = self._stats(x)
        return a * std + mean

    def state_dict(self) -> dict[str, Any]:
        """The statistics as plain values: floats, a tuple and float64 numpy arrays."""
        return {"shape": self.shape, "beta": self.beta, "min_var": self.min_var, "weight": self.weight,
                "first": self._first.copy(), "second": self._second.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, from a normaliser of the same shape and mode."""
        if tuple(state["shape"]) != self.shape or state["beta"] != self.beta:
            raise ValueError(f"expected a state of shape {self.shape} and beta {self.beta}, "
                             f"got shape {tuple(state['shape'])} and beta {state['beta']}")
        self.min_var = float(state["min_var"])
        self.weight = float(state["weight"])
        self._first = np.array(state["first"], np.float64).reshape(self.shape)
        self._second = np.array(state["second"], np.float64).reshape(self.shape)
