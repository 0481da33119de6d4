"""Small deterministic PettingZoo parallel envs for the multi-agent tests, and ``all_items`` of a table."""

from __future__ import annotations

import functools
from typing import ClassVar

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv

from rlflow.replay.items import LANE, LENGTH, START, VALID


class DyingAgents(ParallelEnv):
    """Agents ``a0 .. a{A-1}``; agent ``i`` terminates on its ``deaths[i]``-th step (None: never); every agent
    still alive is truncated on step ``max_steps``. Observation of agent ``i`` at time ``t``:
    ``[i, t, episode, 0]``; reward of its step ``t`` (taken from time ``t``): ``10 * i + t + action``.
    ``info[agent]["action_mask"]``: action ``t % 3`` is illegal. The global state is ``[t, episode]``.
    """

    metadata: ClassVar[dict] = {"name": "dying_agents_v0"}

    def __init__(self, deaths=(2, None, 4), max_steps=6, mask_in_obs=False):
        self.possible_agents = [f"a{i}" for i in range(len(deaths))]
        self.deaths = list(deaths)
        self.max_steps = max_steps
        self.mask_in_obs = mask_in_obs
        self.episode = -1
        self.state_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)

    @functools.cache  # noqa: B019 (PettingZoo's own idiom)
    def observation_space(self, agent):
        box = spaces.Box(-np.inf, np.inf, (4,), np.float32)
        if self.mask_in_obs:
            return spaces.Dict({"observation": box, "action_mask": spaces.Box(0, 1, (3,), np.int8)})
        return box

    @functools.cache  # noqa: B019
    def action_space(self, agent):
        return spaces.Discrete(3)

    def _obs(self, agent):
        i = self.possible_agents.index(agent)
        o = np.array([i, self.t, self.episode, 0], np.float32)
        if self.mask_in_obs:
            return {"observation": o, "action_mask": self._mask()}
        return o

    def _mask(self):
        m = np.ones(3, np.int8)
        m[self.t % 3] = 0
        return m

    def state(self):
        return np.array([self.t, self.episode], np.float32)

    def reset(self, seed=None, options=None):
        self.episode += 1
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {"action_mask": self._mask()} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        rewards = {a: float(10 * self.possible_agents.index(a) + self.t + int(actions[a])) for a in self.agents}
        self.t += 1
        term = {a: self.deaths[self.possible_agents.index(a)] == self.t for a in self.agents}
        trunc = {a: self.t >= self.max_steps and not term[a] for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        infos = {a: {"action_mask": self._mask()} for a in self.agents}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rewards, term, trunc, infos


class RandomAgents(ParallelEnv):
    """``A`` agents that end at random: each alive agent terminates with probability ``p_term`` or is cut
    (truncated) with ``p_trunc`` per step; every agent still alive is truncated at ``max_steps``.

    Observations ``[agent, t, episode, lane_id]`` identify each row. ``history`` logs every episode as a
    list of steps ``(acting agents, actions, rewards, terminations, truncations, observations)``.
    """

    metadata: ClassVar[dict] = {"name": "random_agents_v0"}

    def __init__(self, num_agents=3, p_term=0.1, p_trunc=0.05, max_steps=12, seed=0, lane_id=0):
        self.possible_agents = [f"a{i}" for i in range(num_agents)]
        self.p_term, self.p_trunc, self.max_steps = p_term, p_trunc, max_steps
        self.rng = np.random.default_rng(seed)
        self.lane_id = lane_id
        self.episode = -1
        self.history = []
        self.state_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)

    @functools.cache  # noqa: B019
    def observation_space(self, agent):
        return spaces.Box(-np.inf, np.inf, (4,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent):
        return spaces.Discrete(4)

    def _obs(self, agent):
        return np.array([self.possible_agents.index(agent), self.t, self.episode, self.lane_id], np.float32)

    def state(self):
        return np.array([self.t, self.episode, len(self.agents)], np.float32)

    def reset(self, seed=None, options=None):
        self.episode += 1
        self.t = 0
        self.agents = list(self.possible_agents)
        self.history.append([])
        return {a: self._obs(a) for a in self.agents}, self._infos(self.agents)

    def step(self, actions):
        acting = list(self.agents)
        rewards = {a: float(self.rng.integers(-3, 4)) for a in acting}
        self.t += 1
        u = self.rng.random(len(acting))
        term = {a: bool(u[i] < self.p_term) for i, a in enumerate(acting)}
        trunc = {a: (not term[a]) and bool(u[i] > 1 - self.p_trunc or self.t >= self.max_steps)
                 for i, a in enumerate(acting)}
        obs = {a: self._obs(a) for a in acting}
        self.history[-1].append((acting, {a: self._logged(actions[a]) for a in acting}, rewards, term, trunc, obs))
        self.agents = [a for a in acting if not (term[a] or trunc[a])]
        return obs, rewards, term, trunc, self._infos(acting)

    def _logged(self, action):
        return int(action)

    def _infos(self, agents):
        return {a: {} for a in agents}


class TurnGame(AECEnv):
    """Agents ``a0 .. a{A-1}`` move in turn. Agent ``i``'s move ``x`` at game step ``s`` gives every agent
    ``j`` still in the game the reward ``100 * i + 10 * x + j`` (so each agent collects rewards during the
    others' turns). Agent ``quitter`` terminates on its ``quit_at``-th move; the game ends for every
    remaining agent after ``length`` moves in total, as a termination (``ending="terminated"``) or a
    truncation. ``log`` records ``(game, move number, acting agent, action, rewards dict)`` per move.
    """

    metadata: ClassVar[dict] = {"name": "turn_game_v0"}

    def __init__(self, num_agents=3, length=7, quitter=1, quit_at=2, ending="terminated", vector_actions=False):
        super().__init__()
        self.possible_agents = [f"a{i}" for i in range(num_agents)]
        self.length, self.quitter, self.quit_at, self.ending = length, quitter, quit_at, ending
        self.vector_actions = vector_actions
        self.log = []
        self.seeds = []
        self.games = -1

    def observation_space(self, agent):
        return spaces.Dict({"observation": spaces.Box(-np.inf, np.inf, (3,), np.float32),
                            "action_mask": spaces.Box(0, 1, (4,), np.int8)})

    def action_space(self, agent):
        return spaces.MultiDiscrete([4, 4]) if self.vector_actions else spaces.Discrete(4)

    def observe(self, agent):
        i = self.possible_agents.index(agent)
        mask = np.ones(4, np.int8)
        mask[self.moves % 4] = 0
        return {"observation": np.array([i, self.moves, self.games], np.float32), "action_mask": mask}

    def reset(self, seed=None, options=None):
        self.games += 1
        self.seeds.append(seed)
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self.moves = 0
        self.own_moves = {a: 0 for a in self.agents}
        self._order = list(self.agents)
        self.agent_selection = self._order[0]

    def _next(self):
        live = [a for a in self._order if a in self.agents]
        i = live.index(self.agent_selection) if self.agent_selection in live else -1
        return live[(i + 1) % len(live)]

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        i = self.possible_agents.index(agent)
        x = int(np.sum(action))
        self.rewards = {a: float(100 * i + 10 * x + self.possible_agents.index(a)) for a in self.agents}
        self.log.append((self.games, self.moves, agent, np.array(action).tolist(), dict(self.rewards)))
        self.moves += 1
        self.own_moves[agent] += 1
        if agent == f"a{self.quitter}" and self.own_moves[agent] == self.quit_at:
            self.terminations[agent] = True
        if self.moves >= self.length:
            for a in self.agents:
                if not self.terminations[a]:
                    (self.terminations if self.ending == "terminated" else self.truncations)[a] = True
        self._accumulate_rewards()
        nxt = self._next()
        self.agent_selection = nxt
        self._deads_step_first()


class MixedAgents(RandomAgents):
    """:class:`RandomAgents` with two kinds of agent, interleaved in ``possible_agents``: scouts (``scout_i``:
    a float32 ``[agent, t, episode, lane_id]`` observation, ``Discrete(4)`` actions, an action mask in
    ``info`` forbidding action ``t % 4``) and tanks (``tank_i``: a float64 observation of 6, the scout's
    four then ``[10 * agent, -1]``, and ``Box(-1, 1, (2,))`` actions). ``history`` as in RandomAgents, with
    the actions as given."""

    metadata: ClassVar[dict] = {"name": "mixed_agents_v0"}

    def __init__(self, kinds="stts", **kw):
        super().__init__(num_agents=len(kinds), **kw)
        counts = {"s": 0, "t": 0}
        self.possible_agents = []
        for k in kinds:
            self.possible_agents.append(f"{'scout' if k == 's' else 'tank'}_{counts[k]}")
            counts[k] += 1

    @functools.cache  # noqa: B019
    def observation_space(self, agent):
        if agent.startswith("scout"):
            return spaces.Box(-np.inf, np.inf, (4,), np.float32)
        return spaces.Box(-np.inf, np.inf, (6,), np.float64)

    @functools.cache  # noqa: B019
    def action_space(self, agent):
        if agent.startswith("scout"):
            return spaces.Discrete(4)
        return spaces.Box(-1.0, 1.0, (2,), np.float32)

    def _obs(self, agent):
        i = self.possible_agents.index(agent)
        o = [i, self.t, self.episode, self.lane_id]
        if agent.startswith("scout"):
            return np.array(o, np.float32)
        return np.array([*o, 10 * i, -1], np.float64)

    def _infos(self, agents):
        mask = np.ones(4, np.int8)
        mask[self.t % 4] = 0
        return {a: {"action_mask": mask.copy()} if a.startswith("scout") else {} for a in agents}

    def _logged(self, action):
        return action


def n_step_targets(env, n, g, episode, t):
    """Each agent's n-step target of the joint step ``t`` of ``episode`` of a :class:`RandomAgents` env, from its
    log, by agent name: ``(active at t, return, discount, next observation or None, action or None)``. The
    window stops at the agent's own terminated or truncated flag; the discount is 0 after a termination or
    for an agent that did not act at ``t``."""
    steps = env.history[episode]
    k = min(n, len(steps) - t)
    out = {}
    for agent in env.possible_agents:
        active = agent in steps[t][0]
        j = k
        for jj in range(1, k + 1):
            _, _, _, term, trunc, _ = steps[t + jj - 1]
            if term.get(agent) or trunc.get(agent):
                j = jj
                break
        ret = sum(g ** m * steps[t + m][2].get(agent, 0.0) for m in range(j))
        died = steps[t + j - 1][3].get(agent, False)
        out[agent] = (active, ret, 0.0 if died or not active else g ** j, steps[t + j - 1][5].get(agent),
                      steps[t][1].get(agent))
    return out


class LeaderGame(TurnGame):
    """:class:`TurnGame` whose agent ``a0`` differs: it sees ``[moves, game]`` (float64, no action mask) and
    moves with ``MultiDiscrete([4, 4])`` (its move counts as the sum of the two)."""

    metadata: ClassVar[dict] = {"name": "leader_game_v0"}

    def observation_space(self, agent):
        if agent == "a0":
            return spaces.Box(-np.inf, np.inf, (2,), np.float64)
        return super().observation_space(agent)

    def action_space(self, agent):
        return spaces.MultiDiscrete([4, 4]) if agent == "a0" else super().action_space(agent)

    def observe(self, agent):
        if agent == "a0":
            return np.array([self.moves, self.games], np.float64)
        return super().observe(agent)


def all_items(table):
    """Every item of a multi-agent ``table`` as ``(meta, batch)``: the records and the sample they make."""
    items = table.items()
    meta = np.zeros((items["key"].size, 6), np.int64)
    meta[:, LANE], meta[:, START], meta[:, LENGTH], meta[:, VALID] = (
        items["lane"], items["start"], items["length"], items["valid"])
    fields = {"return": items["field/return"], "discount": items["field/discount"]}
    return meta, table.view.gather(table.store, meta, fields)[0]
