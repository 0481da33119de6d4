"""DQN on rlflow: double Q, n-step returns, a Polyak-averaged target and a decaying learning rate by
default; dueling heads and prioritized replay as options.

    python -m baselines.dqn                                  # CartPole-v1, 50k env steps
    python -m baselines.dqn --env-id Acrobot-v1 --total-steps 100000
    python -m baselines.dqn --num-actors 2                   # Ape-X style: actor processes on Ray

rlflow does the data: the env wrapper, an n-step transition adder writing each step once, a uniform or
prioritized table under a SampleToInsertRatio rate limiter (how many samples each env step buys), and
the loop. This file is the algorithm: the TD loss, the learner and the epsilon-greedy policy, on
``baselines/_nets.py``'s ``QNetwork`` (an MLP, with an optional dueling head).
The defaults start from RL Baselines3 Zoo's CartPole-v1 DQN (learning rate 2.3e-3, batch 64, epsilon
falling to 0.04 over the first 16% of the run) and add what keeps the greedy policy stable to the end:
double Q, 3-step returns, a target moving 0.02 of the way to the online network after every learner
step (CleanRL's and SB3's ``tau``), the learning rate falling linearly to 0, and the gradient norm
clipped at 10; one learner step of 64 every 4 env steps on 128-128 networks (16 samples per inserted
transition, spread evenly). baselines/README.md has their runs on CartPole-v1 and Acrobot-v1. Other envs
have presets (``baselines/presets/dqn.yaml``: ``--env-id NAME`` applies NAME's; ``--list-presets``).

With ``--num-actors N`` the run is Ape-X's layout on ``rlflow.distributed`` (``pip install "rlflow[ray]"``):
N actor processes, each with ``--num-envs`` envs and a Q-network of its own whose epsilon falls from 1 over
the first ``--exploration-fraction`` of its share of the run to Ape-X's ``0.4 ** (1 + 7 i / (N - 1))``
(actor ``i``; 0.4 for one actor), but no lower than the one-process final epsilon (0.04 on CartPole:
with few actors Ape-X's last ones act almost greedily, and runs collapsed late), taking the learner's
parameters every ``--sync-period`` env steps; the replay (n-step transitions, uniform or
``--prioritized``) in a replay server; the learner here.
``--address`` joins a running Ray cluster.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import rlflow
from baselines import (
    ActorArgs,
    ActorParts,
    RunArgs,
    VideoArgs,
    check_learning_starts,
    make_env,
    make_eval_env,
    policy_network,
    replay_rate_limiter,
    to_device,
    torch_device,
    train,
)
from baselines._nets import QNetwork, device_of
from baselines._presets import parse
from rlflow import adders, specs
from rlflow.policies import EpsilonGreedy
from rlflow.replay import Fifo, Prioritized, StepStore, Table, Uniform


@dataclass
class Args(RunArgs, ActorArgs, VideoArgs):
    env_id: str = "CartPole-v1"  # a Gymnasium env with discrete actions
    total_steps: int = 50_000  # env steps of the run, over all envs (and actors)
    num_envs: int = 1  # envs stepped together (with --num-actors: per actor)
    learning_rate: float = 2.3e-3  # Adam's learning rate (falls linearly to 0 with --anneal-lr)
    buffer_size: int = 100_000  # replay capacity in transitions, over all envs (and actors)
    batch_size: int = 64  # transitions per learner step
    gamma: float = 0.99  # discount per env step, of the n-step returns and their bootstrap
    n_step: int = 3  # env steps per transition: its return sums n rewards, then bootstraps from the target network
    double_q: bool = True  # the target's action chosen by the online network (--no-double-q: by the target's)
    dueling: bool = False  # a dueling head: Q(s, a) = V(s) + A(s, a) - the mean of A(s, .) over the actions
    prioritized: bool = False  # prioritized replay: sample in proportion to |TD error| ** alpha instead of uniformly
    alpha: float = 0.6  # prioritized replay's priority exponent
    beta: float = 0.4  # importance-sampling exponent of the prioritized replay's weights (constant over the run)
    learning_starts: int = 1_000  # transitions stored before the first learner step
    samples_per_insert: float = 16.0  # sampled transitions per stored one (batch_size / env steps per update)
    train_freq: int = 0  # env steps between bursts of learner steps, as SB3 trains (0: the steps spread evenly)
    target_update_period: int = 1  # learner steps between target-network updates
    tau: float = 0.02  # each update moves the target this share of the way to the online network (1: a copy)
    anneal_lr: bool = True  # the learning rate falls linearly to 0 over the run's learner steps
    exploration_fraction: float = 0.16  # share of total_steps over which epsilon falls to its final value
    exploration_final_eps: float = 0.04  # epsilon after exploration_fraction of the run (Acrobot's preset: 0.1)
    hidden: tuple[int, ...] = (128, 128)  # sizes of the Q-network's hidden layers
    max_grad_norm: float = 10.0  # the gradient's norm is clipped to this at every learner step
    clip_rewards: bool = False  # the loss sees each reward's sign (Atari's presets; needs --n-step 1); logs the game's
    eval_every: int = 10_000  # env steps between evaluations (0: only at the end)
    logdir: str = "runs/dqn"  # directory of the run's logs, checkpoints, saved learners and learning curve


def td_loss(q: QNetwork, target: QNetwork, batch: rlflow.replay.Transition, weights: torch.Tensor,
            double_q: bool, clip_rewards: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance-weighted Huber loss of ``Q(s, a)`` against ``R + discount * Q_target(s', a*)``.

    ``a* = argmax_a Q_target(s', a)``, or ``argmax_a Q(s', a)`` with ``double_q``. ``batch.reward`` is the
    n-step return and ``batch.discount`` its bootstrap factor (``gamma ** k``, 0 after termination), so
    the target needs no further ``gamma``; with ``clip_rewards`` (one-step transitions) ``R`` is the
    reward's sign. Returns the loss and the TD errors.
    """
    with torch.no_grad():
        next_q = target(batch.next_observation)
        if double_q:
            best = q(batch.next_observation).argmax(dim=1, keepdim=True)
            next_v = next_q.gather(1, best).squeeze(1)
        else:
            next_v = next_q.max(dim=1).values
        reward = torch.sign(batch.reward) if clip_rewards else batch.reward
        y = reward + batch.discount * next_v
    q_sa = q(batch.observation).gather(1, batch.action.long().view(-1, 1)).squeeze(1)
    td = y - q_sa
    return (weights * F.smooth_l1_loss(q_sa, y, reduction="none")).mean(), td.detach()


def expected_learner_steps(args: Args) -> int:
    """The learner steps a run of ``args`` makes: ``samples_per_insert`` samples per transition stored after
    the first ``learning_starts``, ``batch_size`` per step (what the learning rate anneals over)."""
    return max(1, round((args.total_steps - args.learning_starts) * args.samples_per_insert / args.batch_size))


class DQNLearner(rlflow.Learner):
    """Adam on :func:`td_loss` with the gradient norm clipped to ``max_grad_norm`` and, with ``anneal_lr``, a
    learning rate falling linearly from ``learning_rate`` to 0 over :func:`expected_learner_steps`; every
    ``target_update_period`` learner steps the target moves ``tau`` of the way to the online network
    (Polyak averaging; ``tau=1`` copies it). It trains on the device of ``q``, where each sample is copied."""

    def __init__(self, q: QNetwork, args: Args) -> None:
        self.q = q
        self.args = args
        self.device = device_of(q)
        self.target = copy.deepcopy(q)
        self.target.requires_grad_(False)
        self.optimizer = torch.optim.Adam(q.parameters(), lr=args.learning_rate, fused=True)
        self.total_steps = expected_learner_steps(args)
        self.steps = 0

    def learning_rate(self) -> float:
        """The learning rate of the next step."""
        if not self.args.anneal_lr:
            return self.args.learning_rate
        return self.args.learning_rate * max(0.0, 1.0 - self.steps / self.total_steps)

    def step(self, sample):
        batch, weights = to_device((sample.data, sample.weights), self.device)  # a Transition of tensors, the weights
        loss, td = td_loss(self.q, self.target, batch, weights, self.args.double_q, self.args.clip_rewards)
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate()
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.q.parameters(), self.args.max_grad_norm)
        self.optimizer.step()
        self.steps += 1
        if self.steps % self.args.target_update_period == 0:
            with torch.no_grad():
                for p_target, p in zip(self.target.parameters(), self.q.parameters(), strict=True):
                    p_target.lerp_(p, self.args.tau)
        priorities = td.abs().cpu().numpy() + 1e-6 if self.args.prioritized else None
        return rlflow.LearnerUpdate({"loss": loss.item(), "td_error": float(td.abs().mean())}, priorities)

    def get_params(self):  # the online network itself; a CPU copy for actor processes when it is on a GPU
        return policy_network(self.q, self.args.num_actors)

    def state_dict(self):
        return {"q": self.q.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict(), "steps": self.steps}

    def load_state_dict(self, state):
        self.q.load_state_dict(state["q"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = state["steps"]


def exploration(q: QNetwork, n_actions: int, args: Args, actor: int | None = None) -> EpsilonGreedy:
    """The epsilon-greedy policy: epsilon falls from 1 over the first ``exploration_fraction`` of the run to
    ``exploration_final_eps``; for actor ``actor`` of several, over its share of the run (``total_steps /
    num_actors``) to its own final value (:func:`actor_epsilon`). In an actor process the network it is given
    (``set_params``) is a copy of the learner's, on the CPU."""
    steps = args.total_steps if actor is None else args.total_steps / max(1, args.num_actors)
    end = args.exploration_final_eps if actor is None else actor_epsilon(args, actor)
    return EpsilonGreedy(q, n_actions, decay_steps=max(1, int(args.exploration_fraction * steps)), end=end,
                         seed=args.seed)


def apex_epsilon(actor: int, num_actors: int) -> float:
    """Ape-X's exploration rate of actor ``actor`` of ``num_actors``: ``0.4 ** (1 + 7 i / (N - 1))`` (0.4 for
    one actor)."""
    return 0.4 if num_actors == 1 else 0.4 ** (1 + 7 * actor / (num_actors - 1))


def actor_epsilon(args: Args, actor: int) -> float:
    """Actor ``actor``'s final epsilon: Ape-X's (:func:`apex_epsilon`), no lower than the one-process run's
    (``exploration_final_eps``)."""
    return max(apex_epsilon(actor, args.num_actors), args.exploration_final_eps)


def main(args: Args) -> rlflow.RunResult:
    device = torch_device(args)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    if args.clip_rewards and args.n_step != 1:
        raise ValueError(f"--clip-rewards clips each reward, which an n-step return has summed: expected --n-step 1, "
                         f"got {args.n_step}")
    check_learning_starts(args.learning_starts, args.buffer_size)
    env = make_env(args.env_id, None if args.num_envs == 1 else args.num_envs, args.seed)
    eval_env = make_eval_env(args)
    n_actions = int(env.single_action_space.n)
    obs_shape = env.single_observation_space.shape

    # Data: every step stored once, one n-step transition item per action, sampled under a ratio.
    lanes = args.num_envs * max(1, args.num_actors)
    # buffer_size transitions: each keeps its n later rows, and frame stacks the rows before it, stored too
    rows = args.buffer_size // lanes + args.n_step + specs.stack_reach(env.spec)
    store = StepStore(env.spec, capacity=rows, lanes=lanes)
    sampler = Prioritized(args.alpha, args.beta, seed=args.seed) if args.prioritized else Uniform(seed=args.seed)
    # The spread window holds one sample and one env step's items (one process) or one actor's block of 32 steps.
    items = args.num_envs * args.n_step  # an episode's end completes n_step transitions at once
    window = args.batch_size + (32 if args.num_actors else 1) * items * args.samples_per_insert
    table = Table(store, sampler=sampler, remover=Fifo(), rate_limiter=replay_rate_limiter(
        args, args.num_envs, args.n_step, error_buffer=max(window, 2 * args.batch_size)))
    adder = adders.NStepTransition(store, [table], n=args.n_step, discount=args.gamma)

    # The algorithm: the learner trains the online network on the device; the policy acts with it (the loop
    # hands it over through get_params / set_params).
    learner = DQNLearner(QNetwork(obs_shape, n_actions, args.hidden, args.dueling).to(device), args)
    policy = exploration(learner.q, n_actions, args)
    if not args.num_actors:
        return train("DQN", args, env, eval_env, policy, learner, adder, table, bursts=args.train_freq > 0)

    # Ape-X: actor processes with their own networks and epsilons; the evaluation policy acts greedily.
    parts = ActorParts(args, args.num_envs, lambda a, i: exploration(
        QNetwork(obs_shape, n_actions, a.hidden, a.dueling), n_actions, a, actor=i))
    return train("DQN", args, env, eval_env, policy, learner, adder, table, actors=(parts.env, parts.policy))


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> Args:
    """DQN's settings from the command line ``argv`` (default: the process's), on top of the preset of the
    env ``--env-id`` names (``baselines/presets/dqn.yaml``) or of a run's ``--config``."""
    return parse(Args, "dqn", argv, prog=prog,
                 hint="--learning-rate, --total-steps, --exploration-fraction, --exploration-final-eps, "
                      "--samples-per-insert, --n-step, --tau or --target-update-period")


if __name__ == "__main__":
    main(parse_args())
