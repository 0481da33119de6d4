"""The network and loss pieces several baselines use: an MLP, the Nature DQN's convolutional torso, a
``Q(s, a)`` critic, a Q-network, a categorical distribution, a maximum over legal actions, PPO's clipped
objective and the device of a network.

Not a baseline (``rlflow list`` skips files whose name starts with ``_``); each baseline imports from
here and from ``baselines/__init__.py`` only.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def device_of(net: nn.Module) -> torch.device:
    """The device of ``net``'s parameters: where its inputs go (policies copy observations there each step)."""
    return next(net.parameters()).device


def mlp(sizes: list[int], out_act: nn.Module | None = None) -> nn.Sequential:
    """Linear layers ``sizes[0] -> sizes[1] -> ... -> sizes[-1]`` with a ReLU between two of them, and
    ``out_act`` after the last one (none by default)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    if out_act is not None:
        layers.append(out_act)
    return nn.Sequential(*layers)


class NatureCNN(nn.Module):
    """The Nature DQN's torso (Mnih et al., 2015) for frame stacks ``[k, 84, 84]`` uint8: the frames scaled to
    [0, 1], convolutions of 32 8x8 filters (stride 4), 64 4x4 (stride 2) and 64 3x3 (stride 1) with ReLUs,
    flattened to 3,136 features."""

    def __init__(self, frames: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(frames, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2),
                                 nn.ReLU(), nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())
        self.out_features = 64 * 7 * 7

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.net(frames.float() / 255.0)


def torso(obs_shape: int | tuple[int, ...]) -> tuple[nn.Module, int]:
    """What a network puts before its hidden layers, and its output size: :class:`NatureCNN` for frame stacks
    ``[k, 84, 84]``, else the observation flattened."""
    shape = (obs_shape,) if isinstance(obs_shape, int) else tuple(obs_shape)
    if len(shape) == 3 and shape[1:] == (84, 84):
        cnn = NatureCNN(shape[0])
        return cnn, cnn.out_features
    return nn.Flatten(), int(np.prod(shape))


class Critic(nn.Module):
    """``Q(s, a)``: an MLP of the observation and action, concatenated (TD3's and SAC's twin critics)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.net = mlp([obs_dim + act_dim, *hidden, 1])

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs.float(), act.float()], dim=1)).squeeze(1)


class QNetwork(nn.Module):
    """Observations to one value per action: hidden ReLU layers on the :func:`torso` of the observations (a
    shape, or a size for flat ones; the Nature DQN's convolutions for frame stacks); dueling: ``V(s) + A(s, a) -
    mean_a A(s, a)``."""

    def __init__(self, obs_shape: int | tuple[int, ...], n_actions: int, hidden: tuple[int, ...],
                 dueling: bool) -> None:
        super().__init__()
        self.torso, size = torso(obs_shape)
        layers: list[nn.Module] = []
        for h in hidden:
            layers += [nn.Linear(size, h), nn.ReLU()]
            size = h
        self.body = nn.Sequential(*layers)
        self.dueling = dueling
        self.head = nn.Linear(size, n_actions)
        self.value = nn.Linear(size, 1) if dueling else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.body(self.torso(obs).float())
        if self.value is None:
            return self.head(x)
        adv = self.head(x)
        return self.value(x) + adv - adv.mean(dim=1, keepdim=True)


def categorical(logits: torch.Tensor) -> torch.distributions.Categorical:
    """The action distribution of ``logits``, without torch's per-call argument checks (the logits come
    from our own network; the checks would double the cost of a small distribution)."""
    return torch.distributions.Categorical(logits=logits, validate_args=False)


def masked_max(q: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(max, argmax)`` of ``q [..., n]`` over the legal actions; rows with none legal give ``(0, 0)``
    (no NaN or -inf from an all-False mask, e.g. a dead agent's)."""
    if mask is None:
        best, arg = q.max(-1)
        return best, arg
    legal = mask.any(-1)
    best, arg = torch.where(mask, q, torch.finfo(q.dtype).min).max(-1)
    return torch.where(legal, best, 0.0), torch.where(legal, arg, 0)


def ppo_terms(dist: torch.distributions.Distribution, value: torch.Tensor, actions: torch.Tensor,
              old_log_prob: torch.Tensor, advantages: torch.Tensor, returns: torch.Tensor, clip: float,
              ent_coef: float, vf_coef: float, mask: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's objective (PPO and MAPPO): ``-mean min(r A, clip(r, 1 - clip, 1 + clip) A) + vf_coef mean
    (V - R)^2 - ent_coef mean H`` over the entries of ``mask`` (all by default), ``r = exp(log pi(a|s) -
    old log pi(a|s))``; the advantages are normalised over those entries first. Returns the loss and its
    three terms as floats."""
    keep = torch.ones_like(advantages, dtype=torch.bool) if mask is None else mask
    ratio = torch.exp(dist.log_prob(actions) - old_log_prob)[keep]
    adv = advantages[keep]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8) if len(adv) > 1 else adv
    policy_loss = -torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv).mean()
    value_loss = (value[keep] - returns[keep]).pow(2).mean()
    entropy = dist.entropy()[keep].mean()
    loss = policy_loss + vf_coef * value_loss - ent_coef * entropy
    return loss, {"policy_loss": policy_loss.item(), "value_loss": value_loss.item(), "entropy": entropy.item()}


def time_major(x: torch.Tensor) -> torch.Tensor:
    """The action rows of ``E`` rollouts ``[E, T + 1, ...]`` (all but the last row) as one contiguous
    ``[T, E, ...]`` tensor."""
    return x[:, :-1].transpose(0, 1).contiguous()
