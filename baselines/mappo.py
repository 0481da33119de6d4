"""MAPPO and IPPO on rlflow: PPO for teams, per-agent GAE, a centralised or local critic.

    python -m baselines.mappo                                # MPE simple_spread (N=3), 16 envs, 2M joint steps
    python -m baselines.mappo --critic local                 # IPPO: each agent's critic sees its own observation
    python -m baselines.mappo --no-shared                    # a separate actor and critic per agent
    python -m baselines.mappo --recurrent                    # rMAPPO: GRU actor and critic, chunks of 10 steps
    python -m baselines.mappo --team-reward                  # every agent learns from the team's reward

rlflow does the data: PettingZoo parallel envs as lanes with an agent axis
(:class:`rlflow.envs.ParallelEnvironment`), a ``Sequence`` adder writing each lane's rollout of
``n_steps`` joint actions as one item of ``n_steps + 1`` rows (rollouts run on across episode ends,
whose final rows they include), a FIFO queue table the learner empties ``num_envs`` rollouts at a time,
and the loop. This file is the algorithm: the actor (one agent's observation and its one-hot id, masked
logits when the env has action masks) and the critic (the global state and the agent's id for MAPPO,
its own observation for IPPO), per-agent GAE (:func:`agent_targets`: each agent's own termination or
truncation, steps where it is not active left out) with a value normaliser, and the clipped PPO
epochs over the active (step, env, agent) samples. ``--recurrent`` puts a GRU in the actor and the critic:
the policy keeps their hidden states (rlflow's actor restarts them at episode starts) and stores the
states each step started from, the learner unrolls the critic over whole rollouts for GAE and trains on
chunks of ``chunk_length`` steps (``rlflow.minibatches.recurrent_chunks``) started from the stored
states and restarted at episode starts. Hyperparameters and network details follow the
MAPPO paper's MPE settings (learning rate 7e-4, 10 epochs, lambda 0.95, clip 0.2, entropy 0.01, hidden
64, value normalisation, a LayerNorm on the inputs, orthogonal initialisation with a 0.01 gain on the
policy's output), except three that measured better here, with 16 envs on simple_spread at 2M steps
(baselines/README.md; the paper runs 128 envs): 4 minibatches per epoch instead of 1, gamma 0.9 instead
of 0.99, and the learning rate falling linearly to 0 (its ``use_linear_lr_decay``; off by default there).
The MPE envs come from ``baselines/_mpe.py`` (shared with QMIX), the MLP, the categorical distribution
and PPO's clipped objective from ``baselines/_nets.py`` (shared with PPO).

Episode returns in the logs are team returns (the sum over agents); the per-agent return (MPE's
usual figure) is that divided by the number of agents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

import rlflow
from baselines import RunArgs, rollout_queue, to_device, torch_device, train
from baselines._mpe import make_env, report, team_dims
from baselines._nets import categorical, device_of, mlp, ppo_terms, time_major
from baselines._presets import parse
from rlflow import specs
from rlflow.minibatches import chunk_resets, feedforward_batches, recurrent_chunks, take
from rlflow.returns import ValueNormalizer, gae


@dataclass
class Args(RunArgs):
    env_id: str = "simple_spread_v3"  # an mpe2 scenario
    n_agents: int = 3  # agents of simple_spread (mpe2's N; other scenarios ignore it)
    max_cycles: int = 25  # steps per episode (mpe2's max_cycles)
    total_steps: int = 2_000_000  # joint env steps, over all envs
    num_envs: int = 16  # parallel MPE envs; each update takes a rollout of each
    n_steps: int = 25  # joint actions per lane per rollout
    learning_rate: float = 7e-4  # Adam's learning rate
    # the learning rate falls linearly to 0 over total_steps / (num_envs * n_steps) learner updates (MAPPO's
    # use_linear_lr_decay); rollouts that hold final rows make a few more updates, which train at 0
    anneal_lr: bool = True  # the learning rate falls linearly to 0 over the run's learner updates
    gamma: float = 0.9  # discount per env step
    gae_lambda: float = 0.95  # GAE's lambda (0: one-step TD advantages, 1: Monte Carlo ones)
    n_epochs: int = 10  # passes over each update's rollouts
    num_minibatches: int = 4  # minibatches per epoch
    clip_range: float = 0.2  # PPO's clip of the probability ratio to 1 +- this
    ent_coef: float = 0.01  # weight of the entropy bonus in the loss
    vf_coef: float = 1.0  # weight of the value loss in the loss
    max_grad_norm: float = 10.0  # the gradient's norm is clipped to this at every minibatch step
    hidden: tuple[int, ...] = (64, 64)  # hidden sizes of the actor and the critic (--recurrent: the last is the GRU's)
    critic: str = "centralised"  # "centralised" (MAPPO: global state) or "local" (IPPO: own observation)
    shared: bool = True  # one actor and one critic for every agent (with its one-hot id), or one per agent
    value_norm: bool = True  # train the critic on normalised returns (rlflow.returns.ValueNormalizer)
    team_reward: bool = False  # every agent learns from the team's reward (the mean over agents), not its own
    recurrent: bool = False  # rMAPPO: a GRU after each network's MLP, trained on chunks of chunk_length steps
    chunk_length: int = 10  # steps per recurrent training chunk (with --recurrent)
    eval_every: int = 100_000  # joint env steps between evaluations (0: only at the end)
    logdir: str = "runs/mappo"  # directory of the run's logs, checkpoints, saved learners and learning curve

    @property
    def batch_size(self) -> int:  # rollouts per learner step: one per lane
        return self.num_envs


def _net(in_dim: int, hidden: tuple[int, ...], out_dim: int, out_gain: float) -> nn.Sequential:
    """MAPPO's MLP: a LayerNorm on the input (feature normalisation), ReLU layers with orthogonal weights
    (gain sqrt 2), an orthogonal output layer of gain ``out_gain`` (0.01 for the policy: near-uniform at first)."""
    net = nn.Sequential(nn.LayerNorm(in_dim), mlp([in_dim, *hidden, out_dim]))
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    for i, layer in enumerate(linears):
        nn.init.orthogonal_(layer.weight, gain=out_gain if i == len(linears) - 1 else 2 ** 0.5)
        nn.init.zeros_(layer.bias)
    return net


class Heads(nn.Module):
    """One network per agent, or one shared network fed the agent's one-hot id: ``[..., A, in] -> [..., A, out]``.

    Recurrent: the MLP's output goes through a GRU cell before the output layer; ``forward(x, h)`` takes and
    returns the hidden state ``[..., A, H]``.
    """

    def __init__(self, in_dim: int, out_dim: int, n_agents: int, hidden: tuple[int, ...], shared: bool,
                 out_gain: float = 1.0, recurrent: bool = False) -> None:
        super().__init__()
        self.n_agents = n_agents
        self.shared = shared
        self.recurrent = recurrent
        self.hidden = hidden[-1] if hidden else in_dim + (n_agents if shared else 0)
        width = in_dim + (n_agents if shared else 0)
        copies = 1 if shared else n_agents
        if recurrent:
            self.bodies = nn.ModuleList(_net(width, hidden[:-1], self.hidden, 2 ** 0.5) for _ in range(copies))
            self.grus = nn.ModuleList(nn.GRUCell(self.hidden, self.hidden) for _ in range(copies))
            self.outs = nn.ModuleList(nn.Linear(self.hidden, out_dim) for _ in range(copies))
            for out in self.outs:
                nn.init.orthogonal_(out.weight, gain=out_gain)
                nn.init.zeros_(out.bias)
        else:
            self.bodies = nn.ModuleList(_net(width, hidden, out_dim, out_gain) for _ in range(copies))

    def _one(self, j: int, x: torch.Tensor, h: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        y = self.bodies[j](x)
        if not self.recurrent:
            return y, None
        lead = y.shape[:-1]
        h = self.grus[j](torch.relu(y).reshape(-1, self.hidden), h.reshape(-1, self.hidden)).reshape(*lead, -1)
        return self.outs[j](h), h

    def forward(self, x: torch.Tensor, h: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.shared:
            ids = torch.eye(self.n_agents, dtype=x.dtype, device=x.device).expand(*x.shape[:-1], self.n_agents)
            return self._one(0, torch.cat([x, ids], dim=-1), h)
        outs = [self._one(i, x[..., i, :], None if h is None else h[..., i, :]) for i in range(self.n_agents)]
        y = torch.stack([o for o, _ in outs], dim=-2)
        return y, (None if h is None else torch.stack([hh for _, hh in outs], dim=-2))


class MAPPONet(nn.Module):
    """The actor (masked categorical logits per agent) and the critic (one value per agent); recurrent ones
    take and return their hidden states ``[..., A, H]``. The observations they take (numpy arrays or tensors)
    go to the device of the network's parameters."""

    def __init__(self, obs_dim: int, state_dim: int, n_actions: int, n_agents: int, args: Args) -> None:
        super().__init__()
        self.centralised = args.critic == "centralised"
        self.recurrent = args.recurrent
        self.actor = Heads(obs_dim, n_actions, n_agents, args.hidden, args.shared, out_gain=0.01,
                           recurrent=args.recurrent)
        self.critic = Heads(state_dim if self.centralised else obs_dim, 1, n_agents, args.hidden, args.shared,
                            recurrent=args.recurrent)
        self.n_agents = n_agents

    def policy(self, obs: dict, h: torch.Tensor | None = None) -> Any:
        """The action distribution (and, recurrent, the actor's next hidden state)."""
        device = device_of(self)
        logits, h = self.actor(torch.as_tensor(obs["obs"], device=device).float(), h)
        if "action_mask" in obs:
            mask = torch.as_tensor(obs["action_mask"], device=device)
            logits = torch.where(mask | ~mask.any(-1, keepdim=True), logits, -1e9)  # all-False rows stay finite
        dist = categorical(logits)
        return (dist, h) if self.recurrent else dist

    def value(self, obs: dict, h: torch.Tensor | None = None) -> Any:
        """``[..., A]`` values (normalised when the learner normalises); recurrent: and the next hidden state."""
        if self.centralised:
            state = torch.as_tensor(obs["state"] if "state" in obs else obs["obs"].reshape(
                *obs["obs"].shape[:-2], -1), device=device_of(self)).float()
            x = state.unsqueeze(-2).expand(*state.shape[:-1], self.n_agents, state.shape[-1])
        else:
            x = torch.as_tensor(obs["obs"], device=device_of(self)).float()
        v, h = self.critic(x, h)
        return (v.squeeze(-1), h) if self.recurrent else v.squeeze(-1)

    def unroll(self, obs: dict, h_actor: torch.Tensor, h_critic: torch.Tensor, resets: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Recurrent: logits ``[B, L, A, n]`` and values ``[B, L, A]`` over sequences ``obs`` (leaves
        ``[B, L, ...]``) from the hidden states ``[B, A, H]``, which restart at zero where ``resets [B, L]``."""
        logits = []
        values = []
        for t in range(resets.shape[1]):
            keep = (~resets[:, t]).float()[:, None, None]
            h_actor = h_actor * keep
            h_critic = h_critic * keep
            step = {k: v[:, t] for k, v in obs.items()}
            dist, h_actor = self.policy(step, h_actor)
            v, h_critic = self.value(step, h_critic)
            logits.append(dist.logits)
            values.append(v)
        return torch.stack(logits, 1), torch.stack(values, 1)


def agent_targets(values: torch.Tensor, rows: dict, mask: Any, gamma: float,
                  lam: float) -> dict[str, torch.Tensor]:
    """Per-agent GAE over ``E`` rollouts of ``T + 1`` rows, time-major ``[T, E, A]`` out.

    Agent ``a`` acted at step ``t`` (``active``) when row ``t`` is an action row (not a final row, not
    padding) and the agent was active there. Its reward is row ``t``'s, its next value ``V(row t + 1)``
    (its true final observation when the step ended it), cut to 0 when row ``t + 1`` says it terminated;
    steps where it did not act get reward 0 and cut the recursion. ``values``: ``[E, T + 1, A]``, in
    return units; ``rows`` and ``mask [E, T + 1]``: numpy arrays or tensors on the device of ``values``.
    """
    obs = rows["observation"]
    valid = ~rows["last"][:, :-1] & mask[:, :-1] & mask[:, 1:]
    # every [E, T, A] array made time-major, [T, E, A], as gae takes them
    active = torch.as_tensor(obs["active"][:, :-1] & valid[..., None]).transpose(0, 1)
    reward = torch.where(active, torch.as_tensor(rows["reward"][:, :-1]).transpose(0, 1), 0.0)
    terminated = torch.as_tensor(obs["terminated"][:, 1:]).transpose(0, 1) & active
    truncated = torch.as_tensor(obs["truncated"][:, 1:]).transpose(0, 1) | ~active
    value = values[:, :-1].transpose(0, 1)
    next_value = values[:, 1:].transpose(0, 1)
    adv, ret = gae(reward, value, next_value, terminated, truncated, gamma, lam)
    return {"active": active, "advantages": adv, "returns": ret}


def team_rewards(reward: np.ndarray) -> np.ndarray:
    """Each agent's reward replaced by the team's, the mean over agents (``[..., A]`` in and out): what the
    MAPPO paper and EPyMARL train on (their MPE rewards are shared), on the scale of one agent's reward, so
    the team return divided by the number of agents, the figure MPE reports, is what every agent maximises."""
    return np.repeat(reward.mean(axis=-1, keepdims=True), reward.shape[-1], axis=-1)


def mappo_loss(net: MAPPONet, obs: dict, actions: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
               returns: torch.Tensor, active: torch.Tensor, clip: float, ent_coef: float,
               vf_coef: float) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's objective (``baselines/_nets.py``'s :func:`ppo_terms`) of a feed-forward network over ``[M, A]`` samples:
    ``M`` (step, env) rows, every agent of a row together (as the centralised critic wants), ``obs`` a dict
    of ``[M, A, ...]`` (and ``state [M, ...]``); means run over the agents that acted (``active``)."""
    return ppo_terms(net.policy(obs), net.value(obs), actions, old_log_prob, advantages, returns, clip, ent_coef,
                     vf_coef, mask=active)


class MAPPOLearner(rlflow.Learner):
    """MAPPO on the device of ``net``, where each update's rollouts are copied."""

    def __init__(self, net: MAPPONet, args: Args) -> None:
        self.net = net
        self.args = args
        self.device = device_of(net)
        self.optimizer = torch.optim.Adam(net.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
        self.norm = ValueNormalizer() if args.value_norm else None
        self.rng = np.random.default_rng(args.seed)
        self.updates = 0
        self.total_updates = max(1, args.total_steps // (args.num_envs * args.n_steps))

    def step(self, sample):
        rows = sample.data
        if self.args.team_reward:
            rows = {**rows, "reward": team_rewards(rows["reward"])}
        rows, mask = to_device((rows, sample.mask), self.device)  # the rollouts as tensors on the learner's device
        obs = rows["observation"]
        if self.args.anneal_lr:
            for group in self.optimizer.param_groups:
                group["lr"] = self.args.learning_rate * max(0.0, 1.0 - self.updates / self.total_updates)
        self.updates += 1
        resets = rows["first"]  # [E, T + 1]: recurrent states restart there
        with torch.no_grad():
            if self.net.recurrent:
                _, values = self.net.unroll(obs, rows["extras"]["h_actor"][:, 0], rows["extras"]["h_critic"][:, 0],
                                            resets)
            else:
                values = self.net.value(obs)
            if self.norm is not None:
                values = self.norm.denormalize(values)
        targets = agent_targets(values, rows, mask, self.args.gamma, self.args.gae_lambda)
        active = targets["active"]  # [T, E, A]
        returns = targets["returns"].float()
        if self.norm is not None:
            self.norm.update(returns[targets["active"]])
            returns = self.norm.normalize(returns)
        # the rollouts' action rows, time-major [T, E, ...]
        steps = {k: time_major(v) for k, v in obs.items()}
        actions = time_major(rows["action"])
        old_log_prob = time_major(rows["extras"]["log_prob"])
        advantages = targets["advantages"].float()
        t, e, _ = active.shape
        if self.net.recurrent:  # the hidden states each step started from
            h_actor = time_major(rows["extras"]["h_actor"])
            h_critic = time_major(rows["extras"]["h_critic"])
            first = time_major(rows["first"])
        metrics: dict[str, float] = {}
        acted_rows = active.any(-1).cpu().numpy()  # the feed-forward minibatches' row mask, read once
        for _ in range(self.args.n_epochs):
            if self.net.recurrent:  # chunks of chunk_length steps, never across a lane, from the stored states
                for c in recurrent_chunks(t, e, self.args.chunk_length, self.args.num_minibatches, rng=self.rng):
                    seq = {k: take(v, c.index) for k, v in steps.items()}
                    logits, values = self.net.unroll(seq, take(h_actor, c.start), take(h_critic, c.start),
                                                     chunk_resets(first, c))
                    # padding past the end: out
                    acted = take(active, c.index) & to_device(c.mask, self.device)[..., None]
                    loss, metrics = ppo_terms(categorical(logits), values,
                                              take(actions, c.index), take(old_log_prob, c.index),
                                              take(advantages, c.index), take(returns, c.index),
                                              self.args.clip_range, self.args.ent_coef, self.args.vf_coef, mask=acted)
                    self._apply(loss)
                continue
            # minibatches of whole (step, env) rows: every agent of a step together (the centralised critic
            # sees the team's state); the loss averages over the agents that acted
            rollout = (steps, actions, old_log_prob, advantages, returns, active)
            for mb_steps, mb_actions, mb_log_prob, mb_advantages, mb_returns, mb_active in feedforward_batches(
                    rollout, t, e, self.args.num_minibatches, rng=self.rng, mask=acted_rows):
                loss, metrics = mappo_loss(self.net, mb_steps, mb_actions, mb_log_prob, mb_advantages, mb_returns,
                                           mb_active, self.args.clip_range, self.args.ent_coef, self.args.vf_coef)
                self._apply(loss)
        return {**metrics, "agent_steps": float(active.sum())}

    def _apply(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.net.parameters(), self.args.max_grad_norm)
        self.optimizer.step()

    def get_params(self):
        return self.net

    def state_dict(self):
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                "norm": self.norm.state_dict() if self.norm is not None else None, "rng": self.rng.bit_generator.state,
                "updates": self.updates}

    def load_state_dict(self, state):
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.norm is not None:
            self.norm.load_state_dict(state["norm"])
        self.rng.bit_generator.state = state["rng"]
        self.updates = int(state.get("updates", 0))  # states saved before the schedule existed: its start


class TeamPolicy(rlflow.Policy):
    """Samples every agent's action; stores the log-probabilities (and, recurrent, the hidden states the
    step started from, where the learner's chunks start) as extras."""

    def __init__(self, net: MAPPONet) -> None:
        self.net = net

    def initial_state(self, batch_size):  # on the network's device, where the states stay between steps
        if not self.net.recurrent:
            return None
        device = device_of(self.net)
        return {"actor": torch.zeros(batch_size, self.net.n_agents, self.net.actor.hidden, device=device),
                "critic": torch.zeros(batch_size, self.net.n_agents, self.net.critic.hidden, device=device)}

    def act(self, observation, state, *, evaluation=False):
        with torch.inference_mode():
            if self.net.recurrent:
                dist, h_actor = self.net.policy(observation, state["actor"])
                _, h_critic = self.net.value(observation, state["critic"])
            else:
                dist = self.net.policy(observation)
            action = dist.probs.argmax(-1) if evaluation else dist.sample()
            extras = {"log_prob": dist.log_prob(action).cpu().numpy()}  # results back from the network's device
        if self.net.recurrent:
            extras.update(h_actor=state["actor"].cpu().numpy(), h_critic=state["critic"].cpu().numpy())
            state = {"actor": h_actor, "critic": h_critic}
        return action.cpu().numpy(), extras, state

    def set_params(self, params):
        self.net = params  # the learner's network itself (one process: no copy, no lag)

    def state_dict(self):
        return {"torch_rng": torch.get_rng_state()}


def main(args: Args) -> rlflow.RunResult:
    device = torch_device(args)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    env = make_env(args, args.num_envs, args.seed)
    eval_env = make_env(args, 1, None)
    obs_dim, state_dim, n_actions = team_dims(env)

    # Rollouts of n_steps + 1 rows per lane in a queue the learner empties num_envs at a time.
    extras = {"log_prob": specs.Field((env.num_agents,), np.float32)}
    if args.recurrent:  # the hidden states each step started from: where the learner's chunks start
        extras.update(h_actor=specs.Field((env.num_agents, args.hidden[-1]), np.float32),
                      h_critic=specs.Field((env.num_agents, args.hidden[-1]), np.float32))
    _, table, adder = rollout_queue(env.step_spec(extras), args.num_envs, args.n_steps)

    net = MAPPONet(obs_dim, state_dim, n_actions, env.num_agents, args).to(device)
    result = train("MAPPO" if args.critic == "centralised" else "IPPO", args, env, eval_env, TeamPolicy(net),
                   MAPPOLearner(net, args), adder, table)
    report(result.final_evaluation, env.num_agents, args.env_id, args.max_cycles)
    return result


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> Args:
    """MAPPO's settings from the command line ``argv`` (default: the process's), on top of the preset of the
    env ``--env-id`` names (``baselines/presets/mappo.yaml``) or of a run's ``--config``."""
    return parse(Args, "mappo", argv, prog=prog,
                 hint="--n-agents, --num-envs, --num-minibatches, --gamma, --learning-rate, --ent-coef, --total-steps")


if __name__ == "__main__":
    main(parse_args())
