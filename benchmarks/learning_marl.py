"""Multi-agent learning benchmark: rlflow's MARL baselines against their targets, several seeds.

Configurations (each baseline's defaults unless noted):

- ``mappo-spread``: MAPPO on MPE simple_spread (N=3, 25 steps, local_ratio 0.5), 2M joint env steps;
  target: per-agent episode return >= -12 (uniform random scores about -28.4, doing nothing -25.4).
- ``ippo-spread``: the same with local critics (IPPO).
- ``qmix-spread`` and ``vdn-spread``: QMIX and VDN at equal steps; target: QMIX matches or beats VDN.
- ``hatd3-speaker-listener``: HATD3 on MPE simple_speaker_listener (continuous actions; the speaker and the
  listener have their own spaces), HARL's tuned settings; the table gives the team return (both agents get
  the same reward) and the per-agent return. ``benchmarks/hatd3_peer.py`` runs AgileRL's MATD3 beside it.
- ``selfplay-tictactoe``: self-play DQN, evaluated against a uniformly random legal player with seats
  alternating; target: wins >= 90% and losses < 5%.

For MPE the table gives the final evaluation (10 greedy episodes, or ``--eval-episodes``) per agent, and
the same evaluation on the scale the MAPPO paper and EPyMARL report (their team return, summed over
agents, with collisions counted per agent including itself: ``baselines._mpe.paper_scale``; uniform
random play scores about -238 there on mpe2, -233 in the papers); median and range over seeds.

    python benchmarks/learning_marl.py --configs selfplay-tictactoe --seeds 1 2 3
    python benchmarks/learning_marl.py --configs mappo-spread --seeds 1 2 3 --steps 2000000

Needs the ``mpe`` extra for the MPE configurations. Not a test: a 2M-step MPE run takes about an hour
on one core here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "mappo-spread": ("mappo", {}),
    "ippo-spread": ("mappo", {"critic": "local"}),
    "qmix-spread": ("qmix", {"mixer": "qmix"}),
    "vdn-spread": ("qmix", {"mixer": "vdn"}),
    "hatd3-speaker-listener": ("hatd3", {}),
    "selfplay-tictactoe": ("selfplay_dqn", {}),
}


def run(name: str, seed: int, steps: int | None, out: Path, eval_episodes: int | None = None) -> dict[str, float]:
    import importlib

    module_name, options = CONFIGS[name]
    module = importlib.import_module(f"baselines.{module_name}")
    if eval_episodes is not None:
        options = {**options, ("eval_games" if module_name == "selfplay_dqn" else "eval_episodes"): eval_episodes}
    args = module.Args(seed=seed, progress=False, logdir=str(out / f"{name}-seed{seed}"), **options)
    if steps is not None:
        args = replace(args, **({"total_turns": steps} if module_name == "selfplay_dqn" else {"total_steps": steps}))
    start = time.perf_counter()
    result = module.main(args)
    seconds = time.perf_counter() - start
    if module_name == "selfplay_dqn":
        return {**result, "seconds": seconds}
    team = float(result.final_evaluation)
    if module_name == "hatd3":  # the agents of the preset's scenario: its env says how many
        return {"team": team, "per_agent": team / module.make_env(args, 1, None).num_agents, "seconds": seconds}
    from baselines._mpe import paper_scale

    return {"per_agent": team / args.n_agents, "paper": paper_scale(team, args.n_agents, args.max_cycles),
            "seconds": seconds}


def summary(values: list[float], fmt: str = "{:.2f}") -> str:
    med = statistics.median(values)
    return f"{fmt.format(med)} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--seeds", nargs="*", type=int, default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=None, help="env steps (turns for self-play) instead of defaults")
    parser.add_argument("--eval-episodes", type=int, default=None,
                        help="episodes per evaluation (games for self-play; defaults: 10 episodes, 200 games)")
    parser.add_argument("--out", default="runs/learning_marl")
    args = parser.parse_args(argv)
    out = Path(args.out)
    lines = ["| config | seeds | result: median [min, max] | minutes per run |", "|---|---|---|---:|"]
    for name in args.configs:
        results = [run(name, seed, args.steps, out, args.eval_episodes) for seed in args.seeds]
        minutes = statistics.median(r["seconds"] for r in results) / 60
        if "win" in results[0]:
            text = (f"win {summary([r['win'] * 100 for r in results], '{:.1f}%')}, "
                    f"loss {summary([r['loss'] * 100 for r in results], '{:.1f}%')}")
        elif "team" in results[0]:
            text = (f"team return {summary([r['team'] for r in results])}, per-agent "
                    f"{summary([r['per_agent'] for r in results])}")
        else:
            text = (f"per-agent return {summary([r['per_agent'] for r in results])}; on the MAPPO paper's "
                    f"scale {summary([r['paper'] for r in results], '{:.1f}')}")
        lines.append(f"| {name} | {' '.join(map(str, args.seeds))} | {text} | {minutes:.1f} |")
        print(lines[-1], flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
