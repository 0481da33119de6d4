"""rlflow's baselines: one file per algorithm (see README.md); this module holds what they share."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import rlflow


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
