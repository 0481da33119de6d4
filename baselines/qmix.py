"""QMIX and VDN on rlflow: recurrent agents, a monotonic mixer (or a sum), episode replay.

    python -m baselines.qmix                                 # MPE simple_spread (N=3), QMIX, 8 envs, 2M joint steps
    python -m baselines.qmix --mixer vdn                     # VDN: the team's Q is the sum of the agents'

rlflow does the data: PettingZoo parallel envs as lanes with an agent axis
(:class:`rlflow.envs.ParallelEnvironment`), an ``Episode`` adder writing every finished episode as one
item, a uniform table sampled as padded ``[B, T + 1, A, ...]`` batches with a mask (pymarl's layout)
under a samples-per-insert ratio, and the loop, whose actor restarts the agents' GRU state at every
episode start. This file is the algorithm: a GRU agent network shared by the agents (fed its one-hot
id), epsilon-greedy over the legal actions, the mixer (QMIX's hypernetworks on the global state, or
VDN's sum), double-Q targets from target networks copied every ``target_update_period`` learner steps,
and the masked TD loss on the team reward (the sum of the agents' rewards) (:func:`td_loss`, tested by
hand). A step's target bootstraps from the next row, also after a time limit (the true final
observation is stored), and not after termination. Hyperparameters follow EPyMARL's MPE settings
(learning rate 5e-4 with Adam, gamma 0.99, batch 32 episodes, 5,000-episode buffer, epsilon 1 -> 0.05
over 50,000 steps, hidden 64, mixing embedding 32, target update every 200 learner steps). One
departure: the hypernetworks take the state through a LayerNorm (``--no-state-norm`` for the original
mixer), without which QMIX's ``Q_tot`` diverges on simple_spread (see baselines/README.md). The MPE envs
come from ``baselines/_mpe.py`` (shared with MAPPO), the maximum over legal actions from
``baselines/_nets.py``.

Episode returns in the logs are team returns (the sum over agents).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

import rlflow
from baselines import RunArgs, to_device, torch_device, train
from baselines._mpe import make_env, report, team_dims
from baselines._nets import device_of, masked_max
from baselines._presets import parse
from rlflow import adders
from rlflow.replay import Fifo, SampleToInsertRatio, StepStore, Table, Uniform
from rlflow.returns import ValueNormalizer, lambda_returns


@dataclass
class Args(RunArgs):
    env_id: str = "simple_spread_v3"  # an mpe2 scenario
    n_agents: int = 3  # agents of simple_spread (mpe2's N; other scenarios ignore it)
    max_cycles: int = 25  # steps per episode (mpe2's max_cycles)
    mixer: str = "qmix"  # "qmix" or "vdn"
    total_steps: int = 2_000_000  # joint env steps, over all envs
    num_envs: int = 8  # parallel MPE envs
    buffer_episodes: int = 5_000  # replay capacity in episodes (of max_cycles + 1 rows each)
    batch_size: int = 32  # episodes per learner step
    samples_per_insert: float = 32.0  # episodes sampled per episode stored: one learner step per episode
    learning_starts: int = 32  # episodes stored before learning
    learning_rate: float = 5e-4  # Adam's learning rate of the agent network and the mixer
    gamma: float = 0.99  # discount per env step of the team's TD targets
    epsilon_start: float = 1.0  # exploration rate at the start
    epsilon_end: float = 0.05  # exploration rate from epsilon_steps on
    epsilon_steps: int = 50_000  # joint env steps (over all envs) to anneal epsilon
    hidden: int = 64  # width of the agent network's input layer and GRU
    mixing_embed: int = 32  # width of QMIX's mixing layer (with --mixer qmix)
    hypernet_embed: int = 64  # hidden width of the hypernetworks that make the mixing weights
    # The hypernetworks see the state through a LayerNorm. Without it QMIX's Q_tot diverges on simple_spread:
    # the mixing weights grow with the state as agents drift out, and the targets climb with them.
    state_norm: bool = True  # a LayerNorm on the state the hypernetworks see (--no-state-norm: the original mixer)
    target_update_period: int = 200  # learner steps between copies of the networks into the targets
    target_tau: float = 0.0  # > 0: soft updates instead, target <- tau * online + (1 - tau) * target every step
    td_lambda: float = 0.0  # > 0: TD(lambda) targets over each episode (0: one-step targets)
    max_grad_norm: float = 10.0  # the gradient's norm is clipped to this at every learner step
    # TD targets on the team reward minus its running mean, over its running standard deviation (EPyMARL's
    # standardise_rewards). The shift keeps the best policy only where no episode terminates (simple_spread
    # only truncates).
    standardise_rewards: bool = False  # TD targets on the team reward standardised by its running mean and std
    eval_every: int = 100_000  # joint env steps between evaluations (0: only at the end)
    logdir: str = "runs/qmix"  # directory of the run's logs, checkpoints, saved learners and learning curve


class AgentNet(nn.Module):
    """The agents' shared recurrent Q network: ``(observation, one-hot id)`` -> GRU -> Q per action."""

    def __init__(self, obs_dim: int, n_actions: int, n_agents: int, hidden: int) -> None:
        super().__init__()
        self.n_agents = n_agents
        self.hidden = hidden
        self.inp = nn.Linear(obs_dim + n_agents, hidden)
        self.rnn = nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(hidden, n_actions)

    def forward(self, obs: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``obs [N, A, obs]``, ``h [N, A, hidden]`` -> ``(Q [N, A, n_actions], h')``."""
        n, a = obs.shape[:2]
        ids = torch.eye(a, dtype=obs.dtype, device=obs.device).expand(n, a, a)
        x = torch.relu(self.inp(torch.cat([obs.flatten(2), ids], -1)))
        h = self.rnn(x.reshape(n * a, -1), h.reshape(n * a, -1)).reshape(n, a, -1)
        return self.out(h), h

    def unroll(self, obs: torch.Tensor) -> torch.Tensor:
        """Q of every row of episodes ``obs [B, L, A, obs]``, the state starting at zero: ``[B, L, A, n]``."""
        b, length, a = obs.shape[:3]
        h = obs.new_zeros(b, a, self.hidden)
        qs = []
        for t in range(length):
            q, h = self(obs[:, t], h)
            qs.append(q)
        return torch.stack(qs, 1)


class QMixer(nn.Module):
    """QMIX's mixer: ``Q_tot = w2 . elu(w1 . q + b1) + b2`` with non-negative ``w1, w2`` made by
    hypernetworks from the global state (monotonic in every agent's Q)."""

    def __init__(self, n_agents: int, state_dim: int, embed: int, hypernet_embed: int,
                 state_norm: bool = False) -> None:
        super().__init__()
        self.n_agents = n_agents
        self.embed = embed
        self.norm = nn.LayerNorm(state_dim) if state_norm else nn.Identity()
        self.w1 = nn.Sequential(nn.Linear(state_dim, hypernet_embed), nn.ReLU(), nn.Linear(hypernet_embed,
                                                                                        embed * n_agents))
        self.b1 = nn.Linear(state_dim, embed)
        self.w2 = nn.Sequential(nn.Linear(state_dim, hypernet_embed), nn.ReLU(), nn.Linear(hypernet_embed, embed))
        self.b2 = nn.Sequential(nn.Linear(state_dim, embed), nn.ReLU(), nn.Linear(embed, 1))

    def forward(self, q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """``q [..., A]``, ``state [..., S]`` -> ``[...]``."""
        lead = q.shape[:-1]
        s = self.norm(state.reshape(-1, state.shape[-1]))
        w1 = self.w1(s).abs().view(-1, self.n_agents, self.embed)
        hidden = nn.functional.elu(torch.bmm(q.reshape(-1, 1, self.n_agents), w1) + self.b1(s).unsqueeze(1))
        w2 = self.w2(s).abs().view(-1, self.embed, 1)
        return (torch.bmm(hidden, w2).squeeze(-1) + self.b2(s)).reshape(lead)


class VDNMixer(nn.Module):
    """VDN: ``Q_tot = sum_a Q_a``."""

    def forward(self, q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return q.sum(-1)


def team_state(obs: dict) -> torch.Tensor:
    """The mixer's input: the env's global state, else every agent's observation."""
    if "state" in obs:
        return torch.as_tensor(obs["state"]).float()
    o = torch.as_tensor(obs["obs"]).float()
    return o.reshape(*o.shape[:-2], -1)


def team_reward(rows: dict, mask: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(reward [B, L - 1], valid [B, L - 1])``: each step's reward summed over agents, and the steps that
    are transitions (rows ``t`` and ``t + 1`` in the episode, row ``t`` not its final row)."""
    reward = torch.as_tensor(rows["reward"][:, :-1]).float().sum(-1)
    return reward, torch.as_tensor(mask[:, :-1] & mask[:, 1:] & ~rows["last"][:, :-1])


def td_loss(agent: AgentNet, target_agent: AgentNet, mixer: nn.Module, target_mixer: nn.Module, rows: dict,
            mask: Any, gamma: float, reward: torch.Tensor | None = None, td_lambda: float = 0.0
            ) -> tuple[torch.Tensor, dict[str, float]]:
    """The masked mean squared TD error of ``Q_tot`` on padded episodes ``[B, L, A, ...]`` (``rows`` and
    ``mask``: numpy arrays, or tensors on the networks' device).

    Step ``t`` (rows ``t`` and ``t + 1`` both in the episode, row ``t`` not its final row) has the target
    ``y = sum_a r_t[a] + gamma * (0 if terminated_t else Q_tot'(t + 1))`` where ``Q_tot'`` mixes (target
    mixer, state ``t + 1``) the target agents' Q of the actions the online agents rate best at ``t + 1``
    among the legal ones (double Q). Agents not active at ``t`` add 0 to the mixer's input; at ``t + 1``
    an agent adds its target Q if it acts there or was cut (truncated) arriving there, from its final
    observation, and 0 if it terminated or was gone before. ``reward [B, L - 1]`` replaces the team
    reward (e.g. standardised).

    ``td_lambda > 0``: the TD(lambda) target ``y_t = r_t + gamma * ((1 - lambda) Q_tot'(t + 1) + lambda
    y_{t+1})`` within the episode, and the one-step target above at its last step (terminated or cut):
    :func:`rlflow.returns.lambda_returns` over the episode's steps with ``Q_tot'`` as the values.
    """
    obs = rows["observation"]
    o = torch.as_tensor(obs["obs"]).float()
    q = agent.unroll(o)  # [B, L, A, n]
    with torch.no_grad():
        q_next_target = target_agent.unroll(o)
    actions = torch.as_tensor(rows["action"]).long()
    active = torch.as_tensor(obs["active"])
    chosen = q[:, :-1].gather(-1, actions[:, :-1, ..., None]).squeeze(-1) * active[:, :-1]
    legal = None
    if "action_mask" in obs:  # an agent that was cut has no legal action in its final row: it bootstraps over all
        legal = torch.as_tensor(obs["action_mask"])[:, 1:]
        legal = legal | ~legal.any(-1, keepdim=True)
    # The next row counts for agents that act there or were cut arriving there (their final observation);
    # not for agents that terminated, nor for agents gone before.
    goes_on = (active[:, 1:] | torch.as_tensor(obs["truncated"])[:, 1:]) & ~torch.as_tensor(obs["terminated"])[:, 1:]
    with torch.no_grad():
        _, best = masked_max(q[:, 1:].detach(), legal)
        target_q = q_next_target[:, 1:].gather(-1, best[..., None]).squeeze(-1) * goes_on
        state = team_state(obs)
        q_tot_next = target_mixer(target_q, state[:, 1:])
        team, valid = team_reward(rows, mask)
        if reward is None:
            reward = team
        terminated = torch.as_tensor(rows["terminated"][:, :-1])
        if td_lambda > 0:
            # step t's episode goes on when step t + 1 is a transition too; the returns run time-first
            cut = torch.cat([~valid[:, 1:], torch.ones_like(valid[:, :1])], 1) & ~terminated
            values = torch.cat([torch.zeros_like(q_tot_next[:, :1]), q_tot_next[:, :-1]], 1)
            y = lambda_returns(reward.T, values.T, q_tot_next.T, terminated.T, cut.T, gamma, td_lambda).T
        else:
            y = reward + gamma * torch.where(terminated, 0.0, q_tot_next)
    q_tot = mixer(chosen, team_state(obs)[:, :-1])
    err = (q_tot - y)[valid]
    loss = err.pow(2).mean()
    return loss, {"loss": loss.item(), "q_tot": q_tot[valid].mean().item()}


class QMIXLearner(rlflow.Learner):
    """QMIX (or VDN) on the device of ``agent`` (and ``mixer``), where each sample of episodes is copied."""

    def __init__(self, agent: AgentNet, mixer: nn.Module, args: Args) -> None:
        self.agent = agent
        self.mixer = mixer
        self.args = args
        self.device = device_of(agent)
        self.target_agent = copy.deepcopy(agent)
        self.target_mixer = copy.deepcopy(mixer)
        self.params = [*agent.parameters(), *mixer.parameters()]
        self.target_params = [*self.target_agent.parameters(), *self.target_mixer.parameters()]
        self.optimizer = torch.optim.Adam(self.params, lr=args.learning_rate, fused=True)
        self.updates = 0
        # the exact running mean and variance of every sampled step's team reward
        self.reward_norm = ValueNormalizer(beta=None) if args.standardise_rewards else None

    def step(self, sample):
        rows, mask = to_device((sample.data, sample.mask), self.device)  # the episodes as tensors on the device
        reward = None
        if self.reward_norm is not None:
            reward, valid = team_reward(rows, mask)
            self.reward_norm.update(reward[valid])
            reward = self.reward_norm.normalize(reward)
        loss, metrics = td_loss(self.agent, self.target_agent, self.mixer, self.target_mixer, rows, mask,
                                self.args.gamma, reward, self.args.td_lambda)
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.params, self.args.max_grad_norm)
        self.optimizer.step()
        self.updates += 1
        tau = self.args.target_tau
        if tau > 0:
            with torch.no_grad():
                for p, p_target in zip(self.params, self.target_params, strict=True):
                    p_target.lerp_(p, tau)
        elif self.updates % self.args.target_update_period == 0:
            self.target_agent.load_state_dict(self.agent.state_dict())
            self.target_mixer.load_state_dict(self.mixer.state_dict())
        return metrics

    def get_params(self):
        return self.agent

    def state_dict(self):
        return {"agent": self.agent.state_dict(), "mixer": self.mixer.state_dict(),
                "target_agent": self.target_agent.state_dict(), "target_mixer": self.target_mixer.state_dict(),
                "optimizer": self.optimizer.state_dict(), "updates": self.updates,
                "reward_norm": None if self.reward_norm is None else self.reward_norm.state_dict()}

    def load_state_dict(self, state):
        self.agent.load_state_dict(state["agent"])
        self.mixer.load_state_dict(state["mixer"])
        self.target_agent.load_state_dict(state["target_agent"])
        self.target_mixer.load_state_dict(state["target_mixer"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = state["updates"]
        if self.reward_norm is not None:
            self.reward_norm.load_state_dict(state["reward_norm"])


class EpsilonGreedy(rlflow.Policy):
    """Epsilon-greedy over the legal actions with the recurrent agent network; state: the GRU's ``h``."""

    def __init__(self, agent: AgentNet, args: Args) -> None:
        self.agent = agent
        self.args = args
        self.steps = 0
        self.rng = np.random.default_rng(args.seed)

    def initial_state(self, batch_size):  # on the network's device, where the state stays between steps
        return torch.zeros(batch_size, self.agent.n_agents, self.agent.hidden, device=device_of(self.agent))

    def epsilon(self) -> float:
        frac = min(1.0, self.steps / max(1, self.args.epsilon_steps))
        return self.args.epsilon_start + frac * (self.args.epsilon_end - self.args.epsilon_start)

    def act(self, observation, state, *, evaluation=False):
        with torch.inference_mode():  # the observations to the network's device, the values back
            q, state = self.agent(torch.as_tensor(observation["obs"], device=device_of(self.agent)).float(), state)
        q = q.cpu()
        mask = observation.get("action_mask")
        legal = np.ones(q.shape, bool) if mask is None else np.asarray(mask)
        greedy = masked_max(q, torch.as_tensor(legal))[1].numpy()
        if evaluation:
            return greedy, None, state
        e, a = greedy.shape
        self.steps += e
        explore = self.rng.random((e, a)) < self.epsilon()
        # a uniformly random legal action (action 0 where none is legal)
        scores = self.rng.random(legal.shape) * legal
        random = scores.argmax(-1)
        return np.where(explore, random, greedy), None, state

    def set_params(self, params):
        self.agent = params  # the learner's network itself (one process: no copy, no lag)

    def state_dict(self):
        return {"steps": self.steps, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state):
        self.steps = state["steps"]
        self.rng.bit_generator.state = state["rng"]


def main(args: Args) -> rlflow.RunResult:
    device = torch_device(args)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    env = make_env(args, args.num_envs, args.seed)
    eval_env = make_env(args, 1, None)
    obs_dim, state_dim, n_actions = team_dims(env)

    # Episodes of max_cycles + 1 rows; the store keeps about buffer_episodes of them over the lanes.
    rows = args.max_cycles + 1
    store = StepStore(env.spec, capacity=max(2 * rows, args.buffer_episodes * rows // args.num_envs),
                      lanes=args.num_envs)
    table = Table(store, sampler=Uniform(seed=args.seed), remover=Fifo(), rate_limiter=SampleToInsertRatio(
        args.samples_per_insert, args.learning_starts, error_buffer=args.batch_size + args.samples_per_insert
        * args.num_envs))
    adder = adders.Episode(store, [table], max_length=rows)

    agent = AgentNet(obs_dim, n_actions, env.num_agents, args.hidden).to(device)
    if args.mixer == "qmix":
        mixer = QMixer(env.num_agents, state_dim, args.mixing_embed, args.hypernet_embed, args.state_norm).to(device)
    else:
        mixer = VDNMixer()
    result = train(args.mixer.upper(), args, env, eval_env, EpsilonGreedy(agent, args),
                   QMIXLearner(agent, mixer, args), adder, table)
    report(result.final_evaluation, env.num_agents, args.env_id, args.max_cycles)
    return result


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> Args:
    """QMIX's settings from the command line ``argv`` (default: the process's), on top of the preset of the
    env ``--env-id`` names (``baselines/presets/qmix.yaml``) or of a run's ``--config``."""
    return parse(Args, "qmix", argv, prog=prog,
                 hint="--n-agents, --batch-size, --samples-per-insert, --epsilon-steps, --learning-rate, --total-steps")


if __name__ == "__main__":
    main(parse_args())
