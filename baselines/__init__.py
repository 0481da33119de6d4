"""rlflow's baselines: one file per algorithm (see README.md); this module holds what they share."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import rlflow


def continuous_replay(args: Any, capacity: int) -> tuple[Any, ...]:
    """The off-policy set-up of the continuous-control baselines: the env and an evaluation env, the action
    bounds and sizes, and a one-step transition adder writing to a uniform table under the ratio of
    ``args.samples_per_insert`` (from ``args.learning_starts`` stored transitions on).

    Returns ``(env, eval_env, low, high, obs_dim, act_dim, adder, table)``.
    """
    import numpy as np

    from rlflow import adders, envs
    from rlflow.replay import Fifo, SampleToInsertRatio, StepStore, Table, Uniform

    env = envs.make(args.env_id, num_envs=None, seed=args.seed)
    eval_env = envs.make(args.env_id, num_envs=None)
    space = env.single_action_space
    low, high = space.low.astype(np.float32), space.high.astype(np.float32)
    obs_dim, act_dim = int(np.prod(env.single_observation_space.shape)), int(np.prod(space.shape))
    store = StepStore(env.spec, capacity=capacity)
    table = Table(store, sampler=Uniform(seed=args.seed), remover=Fifo(), rate_limiter=SampleToInsertRatio(
        args.samples_per_insert, args.learning_starts, error_buffer=args.batch_size + args.samples_per_insert))
    adder = adders.NStepTransition(store, [table], n=1, discount=args.gamma)
    return env, eval_env, low, high, obs_dim, act_dim, adder, table


def train(name: str, args: Any, env: Any, eval_env: Any, policy: Any, learner: Any, adder: Any,
          table: Any) -> rlflow.RunResult:
    """Run ``rlflow.run`` with the baseline's common flags, then save the learner, plot and report."""
    import torch

    result = rlflow.run(env, policy, learner, adder, table, steps=args.total_steps, batch_size=args.batch_size,
                        eval_env=eval_env, eval_every=args.eval_every, eval_episodes=args.eval_episodes,
                        logdir=args.logdir, progress=args.progress, seed=args.seed,
                        checkpoint_every=args.checkpoint_every, resume=args.resume)
    env.close()
    eval_env.close()
    torch.save({"args": asdict(args), "learner": learner.state_dict()}, Path(args.logdir) / "learner.pt")
    plot = rlflow.plot_run(result, Path(args.logdir) / "learning_curve.png", title=f"{name} on {args.env_id}")
    print(f"final evaluation: mean return {result.final_evaluation:.1f} over {args.eval_episodes} episodes "
          f"({result.env_steps} env steps, {result.learner_steps} learner steps); plot: {plot}")
    return result
