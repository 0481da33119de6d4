"""rlflow's baselines: one file per algorithm (see README.md).

This module is the run around every baseline's algorithm: the common flags (:class:`RunArgs`), the
data set-ups of the off-policy continuous-control and on-policy baselines, training with
``rlflow.run``, saving and evaluating learners. Network and loss pieces that several baselines use are
in ``_nets.py``, the MPE envs of the multi-agent ones in ``_mpe.py``; no baseline imports another.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from gymnasium.wrappers import RecordVideo

import rlflow
from baselines._presets import write_config
from rlflow.replay.sample import to_torch

if TYPE_CHECKING:
    import torch


@dataclass
class RunArgs:
    """The flags every baseline takes for the run around its algorithm (its own ``Args`` add the rest)."""

    seed: int = 1  # the seed of the envs, the networks and the replay (and of the exploration)
    eval_episodes: int = 10  # episodes of each evaluation, also with --evaluate (selfplay_dqn: --eval-games instead)
    checkpoint_every: int = 0  # env steps between run checkpoints under <logdir>/checkpoints (0: none)
    resume: bool = False  # continue from the latest checkpoint under <logdir>/checkpoints
    progress: bool = True  # show a progress bar (tqdm)
    evaluate: str = ""  # a run's directory (its learner.pt) or a saved learner file: evaluate it instead of training
    wandb_project: str | None = None  # also log the run to Weights & Biases under this project (rlflow[wandb])
    wandb_mode: Literal["online", "offline", "disabled"] | None = None  # offline: wandb sync uploads the run later
    device: str = "auto"  # where the networks train: cpu, cuda, cuda:N, or auto (cuda when available, else cpu)
    preset: str = "auto"  # auto: the env's preset (baselines/presets/NAME.yaml) if it has one; none: the defaults
    list_presets: bool = False  # print the presets (env, flags, source) and exit
    config: str = ""  # a run's <logdir>/config.json: its settings as the defaults (flags given here still win)


def torch_device(args: Any) -> torch.device:
    """The device ``args.device`` names: ``cpu``, ``cuda``, ``cuda:N``, or ``auto`` (CUDA when torch has a CUDA
    device, else the CPU). Raises ValueError naming the flag for a name torch does not know, another kind of
    device, or a CUDA device this machine does not have."""
    import torch

    name = args.device
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {name}: not a device torch knows; use cpu, cuda, cuda:N or auto") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name}: the baselines train on cpu or cuda (cuda:N); use cpu, cuda, cuda:N or "
                         "auto")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "is a CPU build" if torch.version.cuda is None else "sees no GPU"
            raise ValueError(f"--device {name}: no CUDA device is available (torch {torch.__version__} {why}); use "
                             "--device cpu or auto")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"--device {name}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return device


def to_device(arrays: Any, device: torch.device) -> Any:
    """numpy arrays (one, or nested in dicts, tuples and lists) as tensors on ``device``, by the library's
    :func:`rlflow.replay.sample.to_torch`: to a CUDA device they are copied into page-locked memory and from
    there asynchronously (``pin_memory=True``, ``non_blocking``); on the CPU the tensors share the arrays'
    memory (a contiguous array is not copied)."""
    return to_torch(arrays, device, pin_memory=device.type == "cuda")


def policy_network(net: Any, num_actors: int) -> Any:
    """What a learner's ``get_params`` hands its policies of the network ``net``. Policies in this process act
    with ``net`` itself, on its device (no copy, no lag). With actor processes (``num_actors`` > 0), which act
    on the CPU, whatever ``get_params`` returns is pickled to them: a network on another device is handed as a
    copy on the CPU, made at each call (each publication), and a network on the CPU as it is."""
    import copy

    from baselines._nets import device_of

    if not num_actors or device_of(net).type == "cpu":
        return net
    return copy.deepcopy(net).cpu()


@dataclass
class VideoArgs:
    """The flag of the single-agent baselines that records evaluation episodes to video."""

    capture_video: bool = False  # record each evaluation's first episode to <logdir>/videos as mp4 (rlflow[video])


class EvaluationVideo(RecordVideo):
    """gymnasium's ``RecordVideo``, recording the first episode of every evaluation into ``folder``: the
    episode a seeded ``reset`` starts (``rlflow.evaluate`` seeds its first reset; the resets between its
    episodes are not seeded). The recording ends at the next reset, when the episode is over."""

    def __init__(self, env: Any, folder: Path) -> None:
        self.seeded = False
        super().__init__(env, str(folder), episode_trigger=lambda episode: self.seeded, name_prefix="eval",
                         disable_logger=True)

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        self.seeded = seed is not None
        return super().reset(seed=seed, options=options)


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` names an Atari game (``ALE/<Game>-v5``): its envs come from ``rlflow.envs.atari``."""
    return env_id.startswith("ALE/")


def make_env(env_id: str, num_envs: int | None, seed: int | None, **options: Any) -> Any:
    """The training env: ``rlflow.envs.atari`` for an Atari game (preprocessed frame stacks, ``num_envs`` lanes,
    a life lost ending an episode: the logged returns are still game scores; ``options`` may set its
    ``autoreset_mode`` and ``vectorization_mode``), else ``rlflow.envs.make`` (``num_envs=None``: one plain env)
    with ``options``."""
    from rlflow import envs

    if is_atari(env_id):
        unknown = sorted(set(options) - {"autoreset_mode", "vectorization_mode"})
        if unknown:
            raise ValueError(f"{env_id}: Atari envs take no {unknown} (rlflow.envs.atari preprocesses them)")
        return envs.atari(env_id, num_envs or 1, seed=seed, episodic_life=True, **options)
    return envs.make(env_id, num_envs=num_envs, seed=seed, **options)


def make_eval_env(args: Any, *wrappers: Any) -> Any:
    """The evaluation env: one plain ``args.env_id`` env (an Atari game preprocessed and frame-stacked as for
    training) inside the gymnasium ``wrappers`` (first innermost); with ``args.capture_video``, rendered as RGB
    frames and recorded (:class:`EvaluationVideo`) to ``<logdir>/videos``, one mp4 per evaluation
    (``eval-episode-<k>.mp4``, ``k`` counting every episode the env started)."""
    import gymnasium

    from rlflow import envs

    video = getattr(args, "capture_video", False)
    render_mode = "rgb_array" if video else None
    atari = is_atari(args.env_id)
    env = envs.atari_env(args.env_id, render_mode=render_mode) if atari else gymnasium.make(args.env_id,
                                                                                           render_mode=render_mode)
    for wrapper in wrappers:
        env = wrapper(env)
    if video:
        try:
            import moviepy  # noqa: F401  (RecordVideo writes mp4 with it)
        except ImportError:
            raise ImportError('--capture-video needs moviepy: pip install "rlflow[video]"') from None
        env = EvaluationVideo(env, Path(args.logdir) / "videos")
    return envs.GymEnvironment(env, frame_stack=env.observation_space.shape[0] if atari else None)


@dataclass
class ActorArgs:
    """The flags of the baselines that also run with actor processes on Ray (``rlflow.distributed``)."""

    num_actors: int = 0  # actor processes on Ray, each with its own envs and policy; 0: one process
    address: str | None = None  # with --num-actors: a Ray cluster ("auto" or HOST:PORT); None: a local one on 127.0.0.1
    sync_period: int = 400  # with --num-actors: an actor's env steps between parameter pulls (PPO: every update)


def actor_args(args: Any, actor: int) -> Any:
    """``args`` as actor ``actor`` of ``args.num_actors`` uses them: its own seed, and its share of the random
    start (``learning_starts`` over all actors together)."""
    import dataclasses

    changes = {"seed": args.seed + 10_000 * (actor + 1)}
    if hasattr(args, "learning_starts"):
        changes["learning_starts"] = args.learning_starts // args.num_actors
    return dataclasses.replace(args, **changes)


class ActorParts:
    """``make_env`` and ``make_policy`` of a baseline run with ``--num-actors``: actor ``i`` gets ``num_envs``
    envs (None: one plain env) seeded with its own seed, and the policy ``policy_of(args)`` makes from its
    :func:`actor_args`, in its own process; ``env_options`` go to ``envs.make`` (e.g. ``autoreset_mode``) as
    :func:`make_env` makes it."""

    def __init__(self, args: Any, num_envs: int | None, policy_of: Any, **env_options: Any) -> None:
        self.args, self.num_envs, self.policy_of, self.env_options = args, num_envs, policy_of, env_options

    def env(self, actor: int) -> Any:
        return make_env(self.args.env_id, self.num_envs, actor_args(self.args, actor).seed, **self.env_options)

    def policy(self, actor: int) -> Any:
        import torch

        torch.set_num_threads(1)
        return self.policy_of(actor_args(self.args, actor), actor)


class RandomStartPolicy(rlflow.Policy):
    """A continuous-action policy: uniform random actions in the box for the first ``args.learning_starts``
    steps, then :meth:`choose` (the subclass's), clipped to the box. Acts with the learner's actor itself
    (one process: no copy, no lag); checkpoints its step count and RNG."""

    def __init__(self, actor: Any, low: np.ndarray, high: np.ndarray, args: Any) -> None:
        self.actor = actor
        self.low = low
        self.high = high
        self.random_steps = args.learning_starts
        self.steps = 0
        self.rng = np.random.default_rng(args.seed)

    def choose(self, observation: Any, evaluation: bool) -> np.ndarray:
        """Actions ``[E, A]`` of the actor for the observations (before clipping)."""
        raise NotImplementedError

    def act(self, observation, state, *, evaluation=False):
        n = len(observation)
        if evaluation:
            return np.clip(self.choose(observation, True), self.low, self.high).astype(np.float32), None, state
        random = self.steps < self.random_steps
        self.steps += n
        if random:
            return self.rng.uniform(self.low, self.high, (n, len(self.low))).astype(np.float32), None, state
        return np.clip(self.choose(observation, False), self.low, self.high).astype(np.float32), None, state

    def set_params(self, params):
        self.actor = params

    def state_dict(self):
        return {"steps": self.steps, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state):
        self.steps = state["steps"]
        self.rng.bit_generator.state = state["rng"]


def saved_file(given: str, name: str) -> Path:
    """The file ``--evaluate`` names: ``given`` itself, or the run directory's ``name`` (the file a run writes at
    its end); a directory without it raises, naming what to give."""
    path = Path(given)
    if not path.is_dir():
        return path
    if not (path / name).is_file():
        raise FileNotFoundError(f"--evaluate {path}: the directory has no {name} (a run writes it at its end; give "
                                "a run's directory or a saved file)")
    return path / name


def evaluate_saved(args: Any, eval_env: Any, policy: Any, learner: Any) -> rlflow.RunResult:
    """Load the learner state saved at ``args.evaluate`` (a run's directory, for its ``learner.pt``, or a saved
    learner file such as ``learner_best.pt``), hand its parameters to the
    policy and run ``args.eval_episodes`` evaluation episodes (seeded by ``args.seed``); prints their mean
    and standard error. The flags that shape the networks must be the ones the run was made with: a
    mismatch raises, naming the flags that differ."""
    from rlflow.loop.actors import evaluate
    from rlflow.loop.checkpoint import load_state

    path = saved_file(args.evaluate, "learner.pt")
    saved = load_state(path)
    try:
        learner.load_state_dict(saved["learner"])
    except (KeyError, RuntimeError, ValueError) as exc:
        run_flags = set(asdict(RunArgs())) | {"logdir", "total_steps"}
        differ = {k: (v, getattr(args, k, None)) for k, v in saved.get("args", {}).items()
                  if k not in run_flags and v != getattr(args, k, None)}
        raise ValueError(f"{path}: its learner state does not fit this learner ({type(exc).__name__}: "
                         f"{exc}); flags saved vs given: {differ or 'none differ'}") from None
    policy.set_params(learner.get_params())
    returns = np.asarray(evaluate(eval_env, policy, args.eval_episodes, seed=args.seed), np.float64)
    eval_env.close()
    mean = float(returns.mean())
    sem = float(returns.std(ddof=1) / np.sqrt(returns.size)) if returns.size > 1 else float("nan")
    print(f"evaluation of {path}: mean return {mean:.2f} +- {sem:.2f} (standard error) over "
          f"{returns.size} episodes")
    return rlflow.RunResult(evaluations=[(0, mean, float(returns.std()))])


def check_learning_starts(learning_starts: int, buffer_size: int) -> None:
    """Raise ValueError unless learning can start: the replay must hold ``learning_starts`` transitions."""
    if learning_starts > buffer_size:
        raise ValueError(f"--learning-starts: expected at most --buffer-size ({buffer_size}) transitions (learning "
                         f"starts once the replay holds that many), got {learning_starts}")


def replay_rate_limiter(args: Any, lanes: int, n_step: int, error_buffer: float) -> Any:
    """The off-policy baselines' ``SampleToInsertRatio``: ``args.samples_per_insert`` samples per stored
    transition from ``args.learning_starts`` on, with ``error_buffer`` (the learner's steps spread evenly), or,
    with ``args.train_freq`` (the run's ``bursts``: each side goes on until refused), a burst of ``train_freq *
    samples_per_insert / batch_size`` learner steps every ``train_freq`` transitions (over the ``lanes`` envs).
    From the diff ``offset = samples_per_insert * learning_starts`` the lanes step ``train_freq / lanes`` times
    and are refused the next step's up to ``lanes * n_step`` transitions, then the learner trains back to
    ``offset``, refused a sample below it: ``min_diff`` and ``max_diff`` sit half a sample and half an insert
    beyond those diffs (docs/loop.md, bursts: exact for one-step transitions after the first burst; an n-step
    episode end stores up to ``n_step`` at once, so a burst may come a few transitions late)."""
    from rlflow.replay import SampleToInsertRatio

    spi, freq = args.samples_per_insert, args.train_freq
    if not freq:
        return SampleToInsertRatio(spi, args.learning_starts, error_buffer=error_buffer)
    if args.num_actors:
        raise ValueError(f"--train-freq {freq} with --num-actors {args.num_actors}: actor processes write while the "
                         "learner trains, so there are no bursts to make; drop --train-freq (its steps spread "
                         "evenly) or --num-actors")
    if freq < 0 or freq % lanes:
        raise ValueError(f"--train-freq: expected env steps >= 0, a multiple of the {lanes} envs stepped together "
                         f"(transitions over all of them), got {freq}")
    burst = freq * spi / args.batch_size
    if burst < 1 or burst != round(burst):
        raise ValueError(f"--train-freq: each burst is train_freq * samples_per_insert / batch_size learner steps, "
                         f"expected a whole number >= 1, got {freq} * {spi:g} / {args.batch_size} = {burst:g}; "
                         f"set --samples-per-insert to batch_size * gradient_steps / train_freq")
    offset = spi * args.learning_starts
    return SampleToInsertRatio(spi, args.learning_starts, error_buffer=(
        offset - args.batch_size / 2, offset + (freq + lanes * n_step - 0.5) * spi))


def continuous_replay(args: Any, capacity: int) -> tuple[Any, ...]:
    """The off-policy set-up of the continuous-control baselines: the env and an evaluation env, the action
    bounds and sizes, and a one-step transition adder writing to a uniform table under the ratio of
    ``args.samples_per_insert`` (from ``args.learning_starts`` stored transitions on; in bursts with
    ``args.train_freq``: :func:`replay_rate_limiter`); with ``args.num_actors``, a store lane per actor.

    Returns ``(env, eval_env, low, high, obs_dim, act_dim, adder, table)``.
    """
    from rlflow import adders, envs
    from rlflow.replay import Fifo, StepStore, Table, Uniform

    check_learning_starts(args.learning_starts, args.buffer_size)
    lanes = max(1, args.num_actors)  # one env per actor with --num-actors
    steps_at_once = 32 if args.num_actors else 1  # the window holds one sample and one env step (or block)
    env = envs.make(args.env_id, num_envs=None, seed=args.seed)
    eval_env = make_eval_env(args)
    space = env.single_action_space
    low = space.low.astype(np.float32)
    high = space.high.astype(np.float32)
    obs_dim = int(np.prod(env.single_observation_space.shape))
    act_dim = int(np.prod(space.shape))
    store = StepStore(env.spec, capacity=capacity // lanes, lanes=lanes)
    table = Table(store, sampler=Uniform(seed=args.seed), remover=Fifo(), rate_limiter=replay_rate_limiter(
        args, lanes, 1, error_buffer=args.batch_size + steps_at_once * lanes * args.samples_per_insert))
    adder = adders.NStepTransition(store, [table], n=1, discount=args.gamma)
    return env, eval_env, low, high, obs_dim, act_dim, adder, table


def rollout_queue(step_spec: Any, num_envs: int, n_steps: int, num_actors: int = 0) -> tuple[Any, Any, Any]:
    """The on-policy set-up of PPO and MAPPO: a ``Sequence`` adder writing each lane's rollout of
    ``n_steps`` actions as one item of ``n_steps + 1`` rows every ``n_steps`` rows (rollouts run on across
    episode ends), into a FIFO queue the learner empties one rollout of every lane at a time (room for a
    batch plus one env step's items, which the loop checks). With ``num_actors``, ``num_envs`` lanes per
    actor, and room for a batch plus an actor's longest lockstep block (``rlflow.distributed``'s
    ``on_policy``: up to ``2 n_steps + 2`` steps). Returns ``(store, table, adder)``."""
    from rlflow import adders
    from rlflow.replay import Fifo, Queue, StepStore, Table

    lanes = num_envs * max(1, num_actors)
    # (with actors, room for the queue's bound: a batch and the items a block could make at most)
    store = StepStore(step_spec, capacity=(8 if num_actors else 4) * (n_steps + 1), lanes=lanes)
    adder_items = 3  # Sequence.max_items_per_step
    steps_at_once = 2 * n_steps + 2 if num_actors else 1
    table = Table(store, sampler=Fifo(), remover=Fifo(), max_times_sampled=1, cross_episodes=True,
                  rate_limiter=Queue(lanes + steps_at_once * num_envs * adder_items))
    adder = adders.Sequence(store, [table], length=n_steps + 1, period=n_steps, end_behavior="continue")
    return store, table, adder


class BestLearner:
    """An observer of ``rlflow.run`` that writes the learner's state to ``path`` (``learner_best.pt``, in
    ``learner.pt``'s format plus ``"evaluation": {"env_steps", "return"}``) after each evaluation whose mean
    return beats every one before it in the run (the first of equals is kept). With ``resume`` the best
    so far is the one already in ``path``, if there is one and the run resumes from a checkpoint (a run
    that starts afresh replaces it)."""

    def __init__(self, path: Path, args: Any, learner: Any, resume: bool) -> None:
        from rlflow.loop.checkpoint import latest, load_state

        self.path = path
        self.args = args
        self.learner = learner
        self.env_steps = 0
        self.mean_return = -np.inf
        if resume and path.exists() and latest(path.parent / "checkpoints") is not None:
            saved = load_state(path)["evaluation"]
            self.env_steps = int(saved["env_steps"])
            self.mean_return = float(saved["return"])

    def __call__(self, stream: str, env_steps: int, metrics: Any) -> None:
        from rlflow.loop.checkpoint import save_state

        if stream != "eval" or not metrics["return"] > self.mean_return:
            return
        self.env_steps = env_steps
        self.mean_return = float(metrics["return"])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        save_state(self.path, {"args": asdict(self.args), "learner": self.learner.state_dict(),
                               "evaluation": {"env_steps": env_steps, "return": self.mean_return}})


def wandb_logger_of(name: str, args: Any) -> Any:
    """With ``--wandb-project``, a :class:`rlflow.loggers.WandbLogger` for the run (its flags as the config,
    its files under ``<logdir>/wandb``); else None."""
    if not args.wandb_project:
        return None
    from rlflow.loggers import WandbLogger

    env = getattr(args, "env_id", None) or getattr(args, "game", "env")
    Path(args.logdir).mkdir(parents=True, exist_ok=True)
    return WandbLogger(args.wandb_project, name=f"{name}-{env}-seed{args.seed}",
                       config=asdict(args), dir=Path(args.logdir), mode=args.wandb_mode)


def train(name: str, args: Any, env: Any, eval_env: Any, policy: Any, learner: Any, adder: Any,
          table: Any, actors: Any = None, on_policy: bool = False, bursts: bool = False) -> rlflow.RunResult:
    """Run ``rlflow.run`` with the baseline's common flags, then save the learner, plot and report; with
    ``args.evaluate``, evaluate that saved learner instead (:func:`evaluate_saved`). The learner of the best
    evaluation is saved beside the final one as it happens (:class:`BestLearner`), and both results are
    printed at the end. With ``actors`` (``(make_env, make_policy)``), the run is ``rlflow.distributed.run``
    with ``args.num_actors`` actor processes on the Ray cluster at ``args.address`` (None: a local one), in
    lockstep with the learner with ``on_policy``; ``bursts`` is :class:`rlflow.RunConfig`'s (one process)."""
    from rlflow.loop.checkpoint import save_state

    if args.evaluate:
        env.close()
        return evaluate_saved(args, eval_env, policy, learner)
    logdir = Path(args.logdir)
    write_config(args)  # every setting, as the preset and the command line made them: --config runs them again
    best = BestLearner(logdir / "learner_best.pt", args, learner, resume=args.resume)
    observers: list[Any] = [best]
    wandb_logger = wandb_logger_of(name, args)
    if wandb_logger is not None:
        observers.append(wandb_logger)
    options = dict(steps=args.total_steps, batch_size=args.batch_size, eval_env=eval_env, eval_every=args.eval_every,
                   eval_episodes=args.eval_episodes, logdir=args.logdir, progress=args.progress, seed=args.seed,
                   observers=observers, checkpoint_every=args.checkpoint_every, resume=args.resume, bursts=bursts)
    began = time.monotonic()
    if actors is None:
        result = rlflow.run(env, policy, learner, adder, table, **options)
    else:
        from rlflow import distributed

        result = distributed.run(*actors, learner, adder, table, num_actors=args.num_actors, address=args.address,
                                 sync_period=args.sync_period, on_policy=on_policy, **options)
    env.close()
    eval_env.close()
    if wandb_logger is not None:
        wandb_logger.close()
    seconds = time.monotonic() - began
    save_state(logdir / "learner.pt", {"args": asdict(args), "learner": learner.state_dict()})
    plot = rlflow.plot_run(result, logdir / "learning_curve.png", title=f"{name} on {args.env_id}")
    # The last evaluation was printed as it ended (the run's last "eval at" line): not repeated here.
    stopped = f" (stopped: {result.stopped})" if result.stopped else ""
    print(f"done: {result.env_steps} env steps, {result.learner_steps} learner steps in {seconds:.0f} s{stopped}; "
          f"learner: {logdir / 'learner.pt'}; plot: {plot}")
    if best.mean_return > -np.inf:
        print(f"best evaluation: mean return {best.mean_return:.1f} at {best.env_steps} env steps; its learner: "
              f"{best.path}")
    return result
