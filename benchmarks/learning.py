"""Learning benchmark: rlflow's baselines against Stable-Baselines3 with the same hyperparameters.

For each (algorithm, env) and seed, trains rlflow's baseline and SB3's implementation of the same
algorithm for the same env steps and hyperparameters (RL Baselines3 Zoo's; for DQN on CartPole, rlflow's
defaults), one after the other in this process, and records the final evaluation (mean return of 10
greedy episodes; for rlflow also the best of its evaluations every fifth of the run) and the wall-clock
time. Before the first timed run the process
pays its one-time costs (importing matplotlib, TensorBoard's writer and what torch loads on the first
optimizer step), so neither library's time includes them, whichever runs first.
Writes a markdown table (median and range over seeds, and rlflow's time / SB3's), the curves of both
sides (``curves.json``: each training episode's return, SB3's from its Monitor, and rlflow's evaluations)
and their plot; ``--plot DIR ...`` draws one plot from the curves of several runs (two halves run on two
cores).

    python benchmarks/learning.py                                  # every configuration, 3 seeds
    python benchmarks/learning.py --configs dqn-cartpole --seeds 0 1 2 --out runs/learning
    python benchmarks/learning.py --configs dqn-acrobot --seeds 0 0 --steps 10000   # a quick time ratio
    python benchmarks/learning.py --configs sac-lunarlandercontinuous --seeds 0 --no-sb3 &   # both sides at
    python benchmarks/learning.py --configs sac-lunarlandercontinuous --seeds 0 --sb3-only   # once, a core each
    python benchmarks/learning.py --plot runs/rl runs/sb3 --out runs/both   # one plot of both halves' curves

Needs the ``bench`` extra (Stable-Baselines3). Not a test: a CartPole run takes minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from baselines import dqn, ppo, sac, td3
from baselines._presets import load as load_presets
from baselines._presets import typed

BASELINES = {"dqn": dqn, "ppo": ppo, "sac": sac, "td3": td3}


@dataclass
class Config:
    """One algorithm on one env: rlflow's arguments, SB3's, and the return the run should reach."""

    algo: str
    env_id: str
    steps: int
    target: float | None  # the return the targets set (None: none set; the run reports what it reaches)
    rlflow: dict[str, Any] = field(default_factory=dict)  # rlflow's flags (a preset's: see preset())
    sb3: dict[str, Any] = field(default_factory=dict)


def preset(algo: str, env_id: str, target: float | None, sb3: dict[str, Any]) -> Config:
    """The configuration of a baseline's preset (baselines/presets/ALGO.yaml): rlflow runs the preset's flags,
    as ``python -m baselines.ALGO --env-id ENV`` does, for its total_steps; SB3 runs ``sb3``."""
    flags = typed(BASELINES[algo].Args, load_presets(algo)[env_id]["flags"])
    steps = flags.pop("total_steps", BASELINES[algo].Args().total_steps)
    return Config(algo, env_id, steps, target, rlflow=flags, sb3=sb3)


# DQN. SB3 trains in bursts (gradient_steps every train_freq env steps); rlflow spreads the same number of
# samples evenly (samples_per_insert = batch * gradient_steps / train_freq) unless its preset sets
# train_freq (MountainCar's: the same bursts as SB3's). SB3 counts
# target_update_interval in env steps (during a burst the target does not move); rlflow's
# target_update_period counts learner steps.
# CartPole: rlflow's defaults (n-step 3, double Q, a Polyak target moving 0.02 of the way every learner
# step, the learning rate falling linearly to 0); SB3 the same, one gradient step every 4 env steps and a
# target update with each, except double Q, which SB3's DQN does not have, and its learning rate falls
# over the env steps from the first instead of over the learner steps.
DQN_CARTPOLE_SB3 = {"learning_rate": ("linear", 2.3e-3), "batch_size": 64, "buffer_size": 100_000,
                    "learning_starts": 1_000, "gamma": 0.99, "n_steps": 3, "train_freq": 4, "gradient_steps": 1,
                    "target_update_interval": 4, "tau": 0.02, "exploration_fraction": 0.16,
                    "exploration_final_eps": 0.04, "policy_kwargs": {"net_arch": [128, 128]}}
# Acrobot's preset: rlflow's defaults with the zoo's final epsilon (0.1); SB3 as on CartPole, with it.
DQN_ACROBOT_SB3 = {**DQN_CARTPOLE_SB3, "exploration_final_eps": 0.1}
# Zoo's Acrobot and LunarLander settings (LunarLander's preset): one-step targets without double Q and target
# copies every 250 learner steps, a constant learning rate (LunarLander needs box2d, which the bench extra
# installs with gymnasium[box2d]).
DQN_ZOO_SB3 = {"learning_rate": 6.3e-4, "batch_size": 128, "buffer_size": 50_000, "learning_starts": 0, "gamma": 0.99,
               "target_update_interval": 250, "train_freq": 4, "gradient_steps": -1, "exploration_fraction": 0.12,
               "exploration_final_eps": 0.1, "policy_kwargs": {"net_arch": [256, 256]}}

PPO_LUNARLANDER_SB3 = {"n_envs": 16, "n_steps": 1024, "batch_size": 64, "gae_lambda": 0.98, "gamma": 0.999,
                       "n_epochs": 4, "ent_coef": 0.01}

CONFIGS = {
    "dqn-cartpole": Config("dqn", "CartPole-v1", 50_000, 475.0, rlflow={}, sb3=DQN_CARTPOLE_SB3),
    "dqn-acrobot": preset("dqn", "Acrobot-v1", -100.0, sb3=DQN_ACROBOT_SB3),
    "dqn-acrobot-zoo": replace(preset("dqn", "LunarLander-v3", -100.0, sb3=DQN_ZOO_SB3), env_id="Acrobot-v1"),
    "dqn-lunarlander": preset("dqn", "LunarLander-v3", 150.0, sb3=DQN_ZOO_SB3),
    # Zoo's MountainCar: 8 gradient steps of 128 every 16 env steps, target copies every 600 env steps.
    "dqn-mountaincar": preset("dqn", "MountainCar-v0", None, sb3={
        "learning_rate": 4e-3, "batch_size": 128, "buffer_size": 10_000, "learning_starts": 1_000, "gamma": 0.98,
        "target_update_interval": 600, "train_freq": 16, "gradient_steps": 8, "exploration_fraction": 0.2,
        "exploration_final_eps": 0.07, "policy_kwargs": {"net_arch": [256, 256]}}),
    # SAC and TD3 on LunarLanderContinuous: their presets; SB3 with the same settings (a constant learning rate,
    # Gaussian exploration noise).
    "sac-lunarlandercontinuous": preset("sac", "LunarLanderContinuous-v3", 200.0, sb3={
        "learning_rate": 7.3e-4, "buffer_size": 1_000_000, "batch_size": 256, "gamma": 0.99, "tau": 0.01,
        "train_freq": 1, "gradient_steps": 1, "learning_starts": 10_000, "policy_kwargs": {"net_arch": [400, 300]}}),
    "td3-lunarlandercontinuous": preset("td3", "LunarLanderContinuous-v3", 200.0, sb3={
        "learning_rate": 1e-3, "buffer_size": 300_000, "batch_size": 256, "gamma": 0.99, "train_freq": 1,
        "gradient_steps": 1, "learning_starts": 10_000, "action_noise": ("normal", 0.1),
        "policy_kwargs": {"net_arch": [400, 300]}}),
    # Zoo's TD3 on Pendulum: one gradient step of 256 per env step after 10,000 steps; Gaussian noise of
    # std 0.1 in action units (rlflow's exploration_noise is in units of the action half-width, 2 here).
    "td3-pendulum": Config(
        "td3", "Pendulum-v1", 20_000, -200.0,
        rlflow={"learning_rate": 1e-3, "batch_size": 256, "buffer_size": 200_000, "learning_starts": 10_000,
                "samples_per_insert": 256.0, "gamma": 0.98, "exploration_noise": 0.05, "hidden": (400, 300)},
        sb3={"learning_rate": 1e-3, "batch_size": 256, "buffer_size": 200_000, "learning_starts": 10_000,
             "gamma": 0.98, "train_freq": 1, "gradient_steps": 1, "policy_kwargs": {"net_arch": [400, 300]},
             "action_noise": ("normal", 0.1)}),
    # Zoo's PPO on CartPole: 8 envs, 32 steps each, 20 epochs of one 256-step minibatch, learning rate and
    # clip range falling linearly (rlflow's Args default to these).
    "ppo-cartpole": Config(
        "ppo", "CartPole-v1", 100_000, 475.0, rlflow={},
        sb3={"n_envs": 8, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
             "ent_coef": 0.0, "learning_rate": ("linear", 1e-3), "clip_range": ("linear", 0.2)}),
    # Zoo's PPO on LunarLander: 16 envs of 1,024 steps, minibatches of 64, 4 epochs, gamma .999, lambda .98,
    # entropy .01, constant learning rate 3e-4 and clip range .2 (SB3's defaults).
    "ppo-lunarlander": preset("ppo", "LunarLander-v3", 200.0, sb3=PPO_LUNARLANDER_SB3),
    "ppo-lunarlandercontinuous": preset("ppo", "LunarLanderContinuous-v3", None, sb3=PPO_LUNARLANDER_SB3),
    # Zoo's PPO on BipedalWalker: 32 envs of 2,048 steps, minibatches of 64, 10 epochs, gamma .999, lambda .95,
    # learning rate 3e-4, clip .18; SB3 normalises observations and rewards with VecNormalize, rlflow with
    # --normalize-obs and --normalize-reward (its preset).
    "ppo-bipedalwalker": preset("ppo", "BipedalWalker-v3", 250.0, sb3={
        "n_envs": 32, "n_steps": 2048, "batch_size": 64, "gae_lambda": 0.95, "gamma": 0.999, "n_epochs": 10,
        "ent_coef": 0.0, "learning_rate": 3e-4, "clip_range": 0.18, "normalize": True}),
    # PPO with Box actions (a Gaussian policy): zoo's Pendulum-v1 PPO (4 envs of 1,024 steps, gamma .9,
    # lambda .95, 10 epochs of minibatches of 64, learning rate 1e-3, clip .2, no entropy bonus) without its
    # state-dependent exploration (gSDE), which rlflow's PPO does not have; SB3 runs without it too.
    "ppo-pendulum": Config(
        "ppo", "Pendulum-v1", 100_000, None,
        rlflow={"num_envs": 4, "n_steps": 1024, "minibatch_size": 64, "gae_lambda": 0.95, "gamma": 0.9,
                "n_epochs": 10, "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2, "anneal": False},
        sb3={"n_envs": 4, "n_steps": 1024, "batch_size": 64, "gae_lambda": 0.95, "gamma": 0.9, "n_epochs": 10,
             "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2}),
    # Atari (the atari presets, RL Baselines3 Zoo's Atari settings), for the env steps this machine trains in
    # about 40 minutes a side. SB3 on the same games (ALE/...-v5 with frameskip=1 and its AtariWrapper: noop
    # starts, a frame skip of 4 with max-pooling, a life lost ending an episode, FIRE at resets, 84x84 grey
    # frames, 4 stacked), as rlflow's training envs (episodic_life=True); SB3 clips the rewards in the env,
    # rlflow in the loss. Both are evaluated on whole games with the game's rewards, with rlflow's FireReset
    # under SB3's evaluation env (FIRE after each life lost, as rlflow's evaluation envs press it).
    "ppo-breakout": replace(preset("ppo", "atari", None, sb3={
        "atari": True, "n_envs": 8, "n_steps": 128, "batch_size": 256, "n_epochs": 4, "gamma": 0.99,
        "gae_lambda": 0.95, "learning_rate": ("linear", 2.5e-4), "clip_range": ("linear", 0.1), "ent_coef": 0.01,
        "vf_coef": 0.5}), env_id="ALE/Breakout-v5", steps=300_000),
    "dqn-pong": replace(preset("dqn", "atari", None, sb3={
        "atari": True, "buffer_size": 100_000, "learning_rate": 1e-4, "batch_size": 32, "learning_starts": 80_000,
        "target_update_interval": 1000, "train_freq": 4, "gradient_steps": 1, "exploration_fraction": 0.1,
        "exploration_final_eps": 0.01}), env_id="ALE/Pong-v5", steps=200_000),
    # Zoo's SAC on Pendulum: learning rate 1e-3, SB3's SAC defaults otherwise (batch 256, one gradient step
    # per env step after 100 steps, automatic entropy weight).
    "sac-pendulum": Config(
        "sac", "Pendulum-v1", 20_000, -200.0,
        rlflow={"learning_rate": 1e-3, "batch_size": 256, "learning_starts": 100, "samples_per_insert": 256.0},
        sb3={"learning_rate": 1e-3, "batch_size": 256, "learning_starts": 100, "train_freq": 1, "gradient_steps": 1}),
}


def run_rlflow(cfg: Config, seed: int, out: Path) -> tuple[float, float, Any]:
    baseline = BASELINES[cfg.algo]
    # On the CPU, as SB3's runs below (device="cpu"), also where a GPU is.
    args = replace(baseline.Args(), **{**cfg.rlflow, "env_id": cfg.env_id, "total_steps": cfg.steps, "seed": seed,
                                       "eval_every": cfg.steps // 5, "progress": False, "device": "cpu",
                                       "logdir": str(out / f"{cfg.algo}-{cfg.env_id.replace('/', '-')}-rlflow-{seed}")})
    start = time.perf_counter()
    result = baseline.main(args)
    # Training time: SB3's is timed without evaluation, so rlflow's periodic evaluations are left out too.
    return float(result.final_evaluation), time.perf_counter() - start - result.eval_seconds, result


def run_sb3(cfg: Config, seed: int) -> tuple[float, float, list[list[float]]]:
    import gymnasium as gym
    import stable_baselines3
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(1)
    kwargs = dict(cfg.sb3)
    for key, value in kwargs.items():  # ("linear", v): SB3's schedule of progress remaining (1 -> 0)
        if isinstance(value, tuple) and value[0] == "linear":
            kwargs[key] = lambda progress, v=value[1]: progress * v
    env: Any = cfg.env_id
    atari = kwargs.pop("atari", False)
    policy = "CnnPolicy" if atari else "MlpPolicy"
    eval_env: Any = None if atari else gym.make(cfg.env_id)
    normalize = kwargs.pop("normalize", False)
    if atari:  # SB3's Atari envs for training (rewards clipped) and evaluation (the game's rewards)
        import ale_py
        from stable_baselines3.common.env_util import make_atari_env
        from stable_baselines3.common.vec_env import VecFrameStack

        from rlflow.envs import FireReset

        gym.register_envs(ale_py)

        def game(**options: Any) -> Any:
            return gym.make(cfg.env_id, frameskip=1, **options)

        def whole_game(**options: Any) -> Any:
            return FireReset(game(**options))

        env = VecFrameStack(make_atari_env(game, n_envs=kwargs.pop("n_envs", 1), seed=seed), 4)
        eval_env = VecFrameStack(make_atari_env(whole_game, n_envs=1, seed=seed + 10_000, wrapper_kwargs={
            "terminal_on_life_loss": False, "clip_reward": False}), 4)
    elif "n_envs" in kwargs:
        from stable_baselines3.common.env_util import make_vec_env

        env = make_vec_env(cfg.env_id, n_envs=kwargs.pop("n_envs"), seed=seed)
    if normalize:  # the zoo's normalize: true: VecNormalize's observations and rewards while training
        from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

        env = VecNormalize(env, gamma=kwargs["gamma"])
        eval_env = VecNormalize(DummyVecEnv([lambda: gym.make(cfg.env_id)]), training=False, norm_reward=False)
    if "action_noise" in kwargs:  # ("normal", sigma in action units), as the zoo builds it
        shape = gym.make(cfg.env_id).action_space.shape
        kwargs["action_noise"] = NormalActionNoise(np.zeros(shape), kwargs.pop("action_noise")[1] * np.ones(shape))
    episodes: list[list[float]] = []  # [env steps, return] of each training episode (a whole game on Atari)

    class Episodes(BaseCallback):
        def _on_step(self) -> bool:
            episodes.extend([self.num_timesteps, info["episode"]["r"]] for info in self.locals["infos"]
                            if "episode" in info)
            return True

    start = time.perf_counter()
    model = getattr(stable_baselines3, cfg.algo.upper())(policy, env, seed=seed, verbose=0, device="cpu", **kwargs)
    model.learn(total_timesteps=cfg.steps, callback=Episodes())
    seconds = time.perf_counter() - start
    if normalize:  # evaluate with the training statistics, frozen, and the env's own rewards
        eval_env.obs_rms = env.obs_rms
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=True)
    return float(mean), seconds, episodes


def warm_up() -> None:
    """Pay the process's one-time costs before anything is timed: the imports the first run of either
    library would otherwise pay alone (matplotlib, TensorBoard's writer, SB3, and what torch loads when
    it builds and steps its first optimizer, about 2 s here)."""
    import matplotlib.pyplot  # noqa: F401
    import torch
    import torch.utils.tensorboard

    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        pass
    w = torch.zeros(2, requires_grad=True)
    for kwargs in ({"foreach": False}, {"foreach": True}, {"fused": True}):
        opt = torch.optim.Adam([w], lr=1e-3, **kwargs)
        (w * w).sum().backward()
        opt.step()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--no-sb3", action="store_true", help="run rlflow only")
    parser.add_argument("--sb3-only", action="store_true",
                        help="run SB3 only (e.g. beside an --no-sb3 run of the same seeds on another core)")
    parser.add_argument("--out", type=Path, default=Path("runs/learning"))
    parser.add_argument("--plot", type=Path, nargs="+", default=None, metavar="DIR",
                        help="run nothing: plot the curves.json of these runs' --out folders into --out")
    parser.add_argument("--steps", type=int, default=None,
                        help="env steps of every run instead of each configuration's own (a quick wall-clock "
                             "comparison; the targets are for the full budgets)")
    args = parser.parse_args(argv)
    if args.plot:
        merged: dict[str, Any] = {}
        for folder in args.plot:
            for name, sides in json.loads((folder / "curves.json").read_text()).items():
                for side, seeds in sides.items():
                    merged.setdefault(name, {}).setdefault(side, {}).update(seeds)
        args.out.mkdir(parents=True, exist_ok=True)
        _plot(merged, args.out / "learning.png")
        return 0
    rows = ["| algorithm | env | steps | target | rlflow final return: median (min..max) | rlflow best evaluation: "
            "median (min..max) | SB3 final return: median (min..max) | rlflow s / SB3 s (median) |",
            "|---|---|---:|---:|---|---|---|---:|"]
    curves: dict[str, dict[str, dict[str, Any]]] = {}  # config -> side -> seed -> its curves
    warm_up()
    for name in args.configs:
        cfg = CONFIGS[name] if args.steps is None else replace(CONFIGS[name], steps=args.steps)
        ours, best, theirs, ratios = [], [], [], []
        for seed in args.seeds:
            line = f"{name} seed {seed}:"
            if not args.sb3_only:
                ret, secs, result = run_rlflow(cfg, seed, args.out)
                ours.append(ret)
                best.append(max(mean for _, mean, _ in result.evaluations))
                curves.setdefault(name, {}).setdefault("rlflow", {})[str(seed)] = {
                    "train": [[steps, ret] for steps, ret, _ in result.episodes],
                    "eval": [[steps, mean] for steps, mean, _ in result.evaluations]}
                line += f" rlflow {ret:.1f} in {secs:.0f} s"
            if not args.no_sb3:
                sret, ssecs, episodes = run_sb3(cfg, seed)
                theirs.append(sret)
                curves.setdefault(name, {}).setdefault("SB3", {})[str(seed)] = {
                    "train": episodes, "eval": [[cfg.steps, sret]]}
                line += f" SB3 {sret:.1f} in {ssecs:.0f} s"
                if not args.sb3_only:
                    ratios.append(secs / ssecs)
                    line += f" (time ratio {secs / ssecs:.2f})"
            print(line, flush=True)

        def summary(values: list[float]) -> str:
            return f"{statistics.median(values):.1f} ({min(values):.1f}..{max(values):.1f})" if values else "-"

        ratio = f"{statistics.median(ratios):.2f}" if ratios else "-"
        target = "-" if cfg.target is None else f"{cfg.target:g}"
        rows.append(f"| {cfg.algo.upper()} | {cfg.env_id} | {cfg.steps:,} | {target} | {summary(ours)} | "
                    f"{summary(best)} | {summary(theirs)} | {ratio} |")
    table = "\n".join(rows)
    print(f"\nseeds {args.seeds}\n{table}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "learning.md").write_text(table + "\n")
    (args.out / "curves.json").write_text(json.dumps(curves))
    _plot(curves, args.out / "learning.png")
    return 0


def _plot(curves: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    """A panel per configuration: each side's training returns (the mean of each run's last 20 episodes,
    lines) and evaluations (the mean of 10 greedy episodes, markers; SB3's at the end only), per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, max(1, len(curves)), figsize=(6 * max(1, len(curves)), 4), squeeze=False)
    for ax, (name, sides) in zip(axes[0], curves.items(), strict=False):
        for color, (side, seeds) in zip(("C0", "C1"), sorted(sides.items(), key=lambda kv: kv[0] != "rlflow"),
                                        strict=False):
            for k, curve in enumerate(seeds.values()):
                train = np.asarray(curve["train"], np.float64).reshape(-1, 2)
                if len(train):
                    window = min(20, len(train))
                    smooth = np.convolve(train[:, 1], np.ones(window) / window, mode="valid")
                    ax.plot(train[window - 1:, 0], smooth, color=color, alpha=0.8,
                            label=f"{side} training" if k == 0 else None)
                evals = np.asarray(curve["eval"], np.float64).reshape(-1, 2)
                ax.plot(evals[:, 0], evals[:, 1], "o", color=color, alpha=0.8,
                        label=f"{side} evaluation" if k == 0 else None)
        ax.set_title(f"{name}: return")
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"plot: {path}")


if __name__ == "__main__":
    raise SystemExit(main())
