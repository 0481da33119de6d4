"""The MPE (``mpe2``) environments of the multi-agent baselines (MAPPO, QMIX, HATD3): finding a scenario,
making them, one agent's sizes, and the MAPPO paper's scale of a ``simple_spread`` return.

Not a baseline (``rlflow list`` skips files whose name starts with ``_``).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import numpy as np

from rlflow.envs import ParallelEnvironment


def scenario(env_id: str) -> Any:
    """The mpe2 module of scenario ``env_id`` (e.g. ``simple_spread_v3``); ValueError naming the scenarios
    mpe2 has for a name it does not."""
    import mpe2

    names = sorted(m.name for m in pkgutil.iter_modules(mpe2.__path__)
                   if not m.name.startswith("_") and m.name != "all_modules")
    if env_id not in names:
        raise ValueError(f"--env-id {env_id}: not an mpe2 scenario; expected one of {', '.join(names)}")
    return importlib.import_module(f"mpe2.{env_id}")


def make_env(args: Any, num_envs: int, seed: int | None) -> ParallelEnvironment:
    """``num_envs`` parallel envs of the mpe2 scenario ``args.env_id`` as the lanes of one environment,
    each ``args.max_cycles`` steps long (``simple_spread``: with ``args.n_agents`` agents)."""
    module = scenario(args.env_id)
    kwargs = {"N": args.n_agents} if "spread" in args.env_id else {}
    return ParallelEnvironment([module.parallel_env(max_cycles=args.max_cycles, **kwargs)
                                for _ in range(num_envs)], seed=seed)


def report(team_return: float | None, num_agents: int, env_id: str, max_cycles: int) -> None:
    """Print a run's final team return per agent (and, on ``simple_spread``, on the MAPPO paper's scale);
    nothing when the run was stopped before its first evaluation (``team_return`` None)."""
    if team_return is None:
        return
    print(f"per-agent return: {team_return / num_agents:.2f}")
    if "spread" in env_id:
        print(f"on the MAPPO paper's scale: {paper_scale(team_return, num_agents, max_cycles):.1f}")


def team_dims(env: ParallelEnvironment) -> tuple[int, int, int]:
    """``(obs_dim, state_dim, n_actions)`` of one agent: its flat observation, the global state (every
    agent's observation together when the env has no state), its discrete actions."""
    spec = env.observation_spec
    obs_dim = int(np.prod(spec["obs"].shape[1:]))
    state_dim = int(np.prod(spec["state"].shape)) if "state" in spec else env.num_agents * obs_dim
    return obs_dim, state_dim, int(env.single_agent_action_space.n)


def paper_scale(team_return: float, n_agents: int, steps: int) -> float:
    """An mpe2 ``simple_spread`` team return (default ``local_ratio`` 0.5) on the scale of the MAPPO paper
    and EPyMARL: their team return sums, over agents and steps, ``-D - c_i`` with ``D`` the sum over
    landmarks of the nearest agent's distance and ``c_i`` the agents agent ``i`` touches, itself included
    (the original MPE counts an agent as colliding with itself). mpe2 gives agent ``i`` the mean of the
    global ``-D`` and its own ``-(c_i - 1)``, so each agent-step's paper reward is twice mpe2's minus 1:
    ``2 * team_return - n_agents * steps`` for episodes of ``steps`` steps."""
    return 2.0 * team_return - n_agents * steps
