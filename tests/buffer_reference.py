"""A plain reference for the ReplayBuffer facade: random transition streams over any observation space, the
n-step transitions a buffer must hold for them, and what a buffer holds, each as comparable tuples."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from rlflow import specs
from rlflow.replay.items import LANE, LENGTH, START, VALID

G = 0.9


def draw(space: spaces.Space, rng: np.random.Generator) -> Any:
    """One observation of ``space`` (Box values are small integers, so that equal observations happen)."""
    if isinstance(space, spaces.Dict):
        return {k: draw(s, rng) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(draw(s, rng) for s in space.spaces)
    if isinstance(space, spaces.Discrete):
        return np.int64(rng.integers(0, space.n))
    return rng.integers(-9, 9, space.shape).astype(space.dtype)


def key(space: spaces.Space, obs: Any) -> tuple:
    """An observation as a tuple of its leaves' values, in the spec's order (equal iff equal leaf by leaf)."""
    flat = specs.flatten_data(specs.from_space(space), obs)
    return tuple(tuple(np.asarray(v).ravel().tolist()) for v in flat.values())


def stack(items: list[Any]) -> Any:
    """Nested observations (or numbers) stacked along a new leading axis."""
    first = items[0]
    if isinstance(first, dict):
        return {k: stack([x[k] for x in items]) for k in first}
    if isinstance(first, tuple):
        return tuple(stack([x[i] for x in items]) for i in range(len(first)))
    return np.stack([np.asarray(x) for x in items])


def plan_stream(space: spaces.Space, rng: np.random.Generator, plan: list[str]) -> list[tuple]:
    """One env's transitions ``(obs, action, reward, next_obs, terminated, truncated)`` for a plan of:
    ``mid``; ``term``, ``trunc``, ``both`` (the step ends the episode: terminated, truncated, or both);
    ``jump`` (the loop restarts from an unrelated observation without an episode end); ``equal`` (the
    previous next_obs again, as another object); ``reset`` (gymnasium's NEXT_STEP reset step: obs is
    the previous next_obs, reward 0, no flag; after an episode end it is not a transition). After an end
    the next episode starts from a new observation, unless the next step is ``reset``."""
    out = []
    obs = draw(space, rng)
    for i, what in enumerate(plan):
        reward = float(np.float32(rng.standard_normal()))
        if what == "jump":
            obs = draw(space, rng)
        elif what == "equal":
            obs = stack([obs])  # a copy: the same values in new arrays
            obs = batch_row(obs, 0)
        elif what == "reset":
            reward = 0.0
        nxt = draw(space, rng)
        term, trunc = what in ("term", "both"), what in ("trunc", "both")
        out.append((obs, int(rng.integers(0, 4)), reward, nxt, term, trunc))
        ended = term or trunc
        obs = draw(space, rng) if ended and (i + 1 == len(plan) or plan[i + 1] != "reset") else nxt
    return out


def reference(space: spaces.Space, transitions: list[tuple], n: int, closed: bool) -> list[tuple]:
    """The n-step transitions a buffer holds after ``transitions`` of one env, as sorted tuples
    ``(obs, action, reward, discount, next_obs)``.

    A transition right after an episode end whose obs is that end's next_obs, with reward 0 and no flag, is
    gymnasium's NEXT_STEP reset step: not a transition. The others make n-step transitions as
    :func:`nstep_reference` says.
    """
    kept = []
    for i, (obs, action, reward, nxt, term, trunc) in enumerate(transitions):
        prev = transitions[i - 1] if i else None
        if (prev is not None and (prev[4] or prev[5]) and key(space, obs) == key(space, prev[3]) and reward == 0
                and not term and not trunc):
            continue
        kept.append((key(space, obs), action, reward, key(space, nxt), term, trunc))
    return nstep_reference(kept, n, closed)


def nstep_reference(transitions: list[tuple], n: int, closed: bool) -> list[tuple]:
    """The n-step transitions of one env's ``(obs, action, reward, next_obs, terminated, truncated)``, whose
    observations are comparable values, as sorted tuples ``(obs, action, reward, discount, next_obs)``.

    An episode ends on terminated or truncated (terminated when both), or where the next transition's obs is
    not this next_obs (truncated there). The last episode is open unless ``closed``.
    """
    episodes, cur = [], []
    for i, tr in enumerate(transitions):
        cur.append(tr)
        nxt = transitions[i + 1] if i + 1 < len(transitions) else None
        ended = tr[4] or tr[5] or (nxt is not None and nxt[0] != tr[3])
        if ended or nxt is None:
            episodes.append((cur, ended or closed, tr[4]))
            cur = []
    out = []
    for steps, done, terminated in episodes:
        t_max = len(steps)
        for t in range(t_max):
            k = min(n, t_max - t)
            if not done and t + n > t_max:
                continue
            ret = sum(G**j * steps[t + j][2] for j in range(k))
            disc = 0.0 if (done and terminated and t + k == t_max) else G**k
            out.append((steps[t][0], steps[t][1], round(float(np.float32(ret)), 4), round(float(np.float32(disc)), 5),
                        steps[t + k - 1][3]))
    return sorted(out)


def held(buf: Any, space: spaces.Space) -> list[tuple]:
    """Every transition ``buf`` holds, as :func:`reference` gives them."""
    buf.flush()
    it = buf.table.items()
    meta = np.zeros((it["key"].size, 6), np.int64)
    meta[:, LANE], meta[:, START], meta[:, LENGTH], meta[:, VALID] = it["lane"], it["start"], it["length"], it["valid"]
    b, _ = buf.table.view.gather(buf.store, meta, {"return": it["field/return"], "discount": it["field/discount"]})
    return sorted((key(space, batch_row(b.observation, i)), int(b.action[i]), round(float(b.reward[i]), 4),
                   round(float(b.discount[i]), 5), key(space, batch_row(b.next_observation, i)))
                  for i in range(it["key"].size))


def batch_row(batch: Any, i: int) -> Any:
    """Row ``i`` of a nested batch."""
    if isinstance(batch, dict):
        return {k: batch_row(v, i) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(batch_row(v, i) for v in batch)
    return batch[i]
