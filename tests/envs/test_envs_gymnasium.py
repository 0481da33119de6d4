"""The gymnasium wrappers: every autoreset mode gives the TimeStep stream of rlflow.types' flag table.

A counter env encodes (lane, episode, step) in its observation, and episodes of known lengths end by
termination or by a TimeLimit; a slow reference computes each lane's expected stream on its own.
"""

import copy

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import TimeLimit

from rlflow import envs, specs
from rlflow.types import TimeStep, step_spec

LIMIT = 4  # TimeLimit: episodes longer than this are truncated after LIMIT steps
LANES = 3
CALLS = 30


def episode_length(lane: int, episode: int) -> int:
    """Natural length (steps to termination): 2 and 3 terminate, 5 and 6 are truncated at LIMIT."""
    return (2, 5, 3, 6)[(lane + 3 * episode) % 4]


def action_at(call: int, lane: int) -> int:
    return (call + lane) % 2


def reward_of(episode: int, t: int, action: int) -> float:
    return 100.0 * episode + t + 0.5 * action


class CounterEnv(gymnasium.Env):
    """Observation (lane, episode, step); reward encodes (episode, step, action); ends after episode_length."""

    def __init__(self, lane: int, kind: str = "box") -> None:
        self.lane, self.kind = lane, kind
        box = spaces.Box(0, 1000, (3,), np.int64)
        if kind == "box":
            self.observation_space = box
        elif kind == "dict":
            self.observation_space = spaces.Dict({"pos": box, "episode": spaces.Discrete(1000)})
        else:
            self.observation_space = spaces.Tuple((box, spaces.Box(0.0, 1000.0, (2, 2), np.float32)))
        self.action_space = spaces.Discrete(2)
        self.episode, self.t = -1, 0

    def _obs(self):
        pos = np.array([self.lane, self.episode, self.t], np.int64)
        if self.kind == "box":
            return pos
        if self.kind == "dict":
            return {"pos": pos, "episode": self.episode}
        return pos, np.full((2, 2), 10 * self.episode + self.t, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {"episode": self.episode}

    def step(self, action):
        self.t += 1
        terminated = self.t >= episode_length(self.lane, self.episode)
        return self._obs(), reward_of(self.episode, self.t, int(action)), terminated, False, {"t": self.t}


def factories(kind: str = "box"):
    return [lambda i=i: TimeLimit(CounterEnv(i, kind), LIMIT) for i in range(LANES)]


def decode(obs, lane: int, kind: str) -> tuple[int, int, int]:
    """(lane, episode, step) from row ``lane`` of a batched observation, checking every leaf agrees."""
    if kind == "box":
        return tuple(int(v) for v in obs[lane])
    if kind == "dict":
        pos = tuple(int(v) for v in obs["pos"][lane])
        assert int(obs["episode"][lane]) == pos[1]
        return pos
    pos = tuple(int(v) for v in obs[0][lane])
    np.testing.assert_array_equal(obs[1][lane], np.full((2, 2), 10 * pos[1] + pos[2], np.float32))
    return pos


def reference(lane: int, mode: AutoresetMode, calls: int, offset: float = 0.0) -> list[tuple]:
    """Per call: (first, last, terminated, truncated, reward, observation, final observation or None)."""
    out = []
    episode, t, call = 0, 0, 0
    while call < calls:
        t += 1
        length = episode_length(lane, episode)
        reward = reward_of(episode, t, action_at(call, lane)) + offset
        end = t == min(length, LIMIT)
        if not end:
            out.append((False, False, False, False, reward, (lane, episode, t), None))
        else:
            term, trunc = length <= LIMIT, length > LIMIT
            final = (lane, episode, t)
            if mode is AutoresetMode.NEXT_STEP:
                out.append((False, True, term, trunc, reward, final, final))
                call += 1
                if call < calls:  # the reset pseudo-step: first only, reward 0
                    out.append((True, False, False, False, 0.0, (lane, episode + 1, 0), None))
            else:
                out.append((True, True, term, trunc, reward, (lane, episode + 1, 0), final))
            episode, t = episode + 1, 0
        call += 1
    return out


def check_contract(ts: TimeStep, n: int) -> None:
    assert ts.reward.dtype == np.float32 and ts.reward.shape == (n,)
    for flag in (ts.terminated, ts.truncated, ts.first, ts.last):
        assert flag.dtype == np.bool_ and flag.shape == (n,)
    np.testing.assert_array_equal(ts.last, ts.terminated | ts.truncated)
    only_first = ts.first & ~ts.last
    assert not ts.reward[only_first].any() and not ts.last[only_first].any()
    assert (ts.final_observation is None) == (not ts.last.any())


def run(env: envs.GymEnvironment, kind: str, calls: int = CALLS) -> list[list[tuple]]:
    """Step ``calls`` times; per lane the recorded stream in the reference's format."""
    n = env.num_envs
    ts = env.reset(seed=0)
    check_contract(ts, n)
    assert ts.first.all() and not ts.last.any() and not ts.reward.any()
    assert [decode(ts.observation, i, kind) for i in range(n)] == [(i, 0, 0) for i in range(n)]
    got: list[list[tuple]] = [[] for _ in range(n)]
    for call in range(calls):
        ts = env.step(np.array([action_at(call, i) for i in range(n)]))
        check_contract(ts, n)
        obs, final = copy.deepcopy(ts.observation), copy.deepcopy(ts.final_observation)  # valid until next step
        for i in range(n):
            fin = decode(final, i, kind) if ts.last[i] else None
            got[i].append((bool(ts.first[i]), bool(ts.last[i]), bool(ts.terminated[i]), bool(ts.truncated[i]),
                           float(ts.reward[i]), decode(obs, i, kind), fin))
    return got


def check_against_reference(env: envs.GymEnvironment, kind: str, mode: AutoresetMode, offset: float = 0.0) -> None:
    assert env.autoreset_mode is mode
    got = run(env, kind)
    for lane in range(env.num_envs):
        expected = reference(lane, mode, CALLS, offset)
        assert got[lane] == expected, f"lane {lane}"
        finals = [rec[6] for rec in got[lane] if rec[1]]
        assert len(finals) == len(set(finals))  # each final observation exactly once
        assert any(rec[2] for rec in got[lane]) and any(rec[3] for rec in got[lane])  # both kinds of end


MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


@pytest.mark.parametrize("kind", ["box", "dict", "tuple"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_sync_vector_env_matches_reference(mode, kind):
    with envs.GymEnvironment(SyncVectorEnv(factories(kind), autoreset_mode=mode)) as env:
        check_against_reference(env, kind, mode)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_sync_vector_env_without_copies(mode):
    """With copy=False gymnasium reuses its buffer: the final observations must survive the resets."""
    with envs.GymEnvironment(SyncVectorEnv(factories(), copy=False, autoreset_mode=mode)) as env:
        check_against_reference(env, "box", mode)


@pytest.mark.parametrize("kind", ["box", "dict"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_async_vector_env_matches_reference(mode, kind):
    with envs.GymEnvironment(AsyncVectorEnv(factories(kind), autoreset_mode=mode)) as env:
        check_against_reference(env, kind, mode)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_wrapped_vector_env_and_nonzero_pseudo_step_reward(mode):
    """A vector wrapper adds 0.25 to every reward, the NEXT_STEP reset pseudo-step's included: rlflow reports 0."""
    vec = gymnasium.wrappers.vector.TransformReward(SyncVectorEnv(factories(), autoreset_mode=mode), lambda r: r + 0.25)
    with envs.GymEnvironment(vec) as env:
        check_against_reference(env, "box", mode, offset=0.25)


def test_reset_forgets_pending_next_step_resets():
    with envs.GymEnvironment(SyncVectorEnv(factories())) as env:
        env.reset()
        for _ in range(2):
            ts = env.step(np.zeros(LANES, np.int64))
        assert ts.last.tolist() == [True, False, False]  # lane 0 would reset on the next step
        env.reset()
        ts = env.step(np.zeros(LANES, np.int64))
        assert not ts.first.any() and [int(v) for v in ts.observation[:, 2]] == [1, 1, 1]


def test_plain_env_is_one_lane_in_same_step_form():
    inner = TimeLimit(CounterEnv(0), LIMIT)
    with envs.GymEnvironment(inner) as env:
        assert env.num_envs == 1 and env.env is inner
        check_against_reference(env, "box", AutoresetMode.SAME_STEP)
        with pytest.raises(ValueError, match=r"size 1 .*got shape \(\)"):
            env.step(1)


@pytest.mark.parametrize("kind", ["box", "dict", "tuple"])
def test_plain_env_steps_like_a_one_env_sync_vector_env(kind):
    """The plain-env path gives what SyncVectorEnv(SAME_STEP) of the same env gives, infos included."""
    def make():
        return TimeLimit(CounterEnv(0, kind), LIMIT)

    plain = envs.GymEnvironment(make())
    vec = envs.GymEnvironment(SyncVectorEnv([make], autoreset_mode=AutoresetMode.SAME_STEP))
    steps = [(plain.reset(seed=1), vec.reset(seed=1))]
    for call in range(CALLS):
        action = np.array([action_at(call, 0)])
        steps.append((plain.step(action), vec.step(action)))
    for a, b in steps:
        for name in ("reward", "terminated", "truncated", "first", "last"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
            assert getattr(a, name).dtype == getattr(b, name).dtype
        for field in ("observation", "final_observation"):
            x, y = getattr(a, field), getattr(b, field)
            assert (x is None) == (y is None)
            if x is not None:
                for (kx, vx), (ky, vy) in zip(specs.flatten_data(plain.observation_spec, x).items(),
                                              specs.flatten_data(vec.observation_spec, y).items(), strict=True):
                    assert kx == ky and vx.dtype == vy.dtype
                    np.testing.assert_array_equal(vx, vy)
        assert sorted(a.info) == sorted(b.info)
    assert any(a.last.any() for a, _ in steps)
    for a, _ in steps[1:]:  # the plain env's step flags are shared, so read-only
        with pytest.raises(ValueError, match="read-only"):
            a.first[0] = not a.first[0]


def test_disabled_mode_adds_reset_infos():
    with envs.GymEnvironment(SyncVectorEnv(factories(), autoreset_mode=AutoresetMode.DISABLED)) as env:
        env.reset()
        ts = env.step(np.zeros(LANES, np.int64))
        assert "reset_info" not in ts.info and ts.info["t"].tolist() == [1, 1, 1]
        ts = env.step(np.zeros(LANES, np.int64))  # lane 0 ends (length 2)
        assert ts.last.tolist() == [True, False, False]
        assert ts.info["_reset_info"].tolist() == [True, False, False]
        assert ts.info["reset_info"]["episode"][0] == 1


def test_specs_come_from_the_single_spaces():
    obs_space = spaces.Dict({"img": spaces.Box(0, 255, (4, 4, 3), np.uint8), "id": spaces.Discrete(5)})
    act_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    class SpaceEnv(gymnasium.Env):
        observation_space, action_space = obs_space, act_space

    with envs.GymEnvironment(SyncVectorEnv([SpaceEnv, SpaceEnv])) as env:
        assert env.num_envs == 2
        assert env.single_observation_space == obs_space and env.single_action_space == act_space
        assert env.observation_spec == {"img": specs.Field((4, 4, 3), np.uint8),
                                        "id": specs.Field((), np.int64, low=0, high=4)}
        assert env.action_spec == specs.Field((2,), np.float32)
        assert env.spec == step_spec(env.observation_spec, env.action_spec)
        extras = {"log_prob": specs.Field((), np.float32)}
        assert env.step_spec(extras)["extras"] == extras and "extras" not in env.spec
        assert env.autoreset_mode is AutoresetMode.NEXT_STEP


def test_bad_input_raises():
    with envs.GymEnvironment(SyncVectorEnv(factories())) as env:
        with pytest.raises(RuntimeError, match="reset"):
            env.step(np.zeros(LANES, np.int64))
        env.reset()
        with pytest.raises(ValueError, match=r"size 3 .*got shape \(2,\)"):
            env.step(np.zeros(2, np.int64))
        with pytest.raises(ValueError, match="reset_mask"):
            env.reset(options={"reset_mask": np.ones(LANES, bool)})
    with pytest.raises(TypeError, match=r"gymnasium\.Env"):
        envs.GymEnvironment(object())
    with pytest.raises(ValueError, match="autoreset_mode"):
        envs.make("CartPole-v1", 2, autoreset_mode="sometimes")
    with pytest.raises(ValueError, match="num_envs"):
        envs.make("CartPole-v1", 0)
    with pytest.raises(ValueError, match="NEXT_STEP"):
        envs.make("CartPole-v1", 2, vectorization_mode="vector_entry_point", autoreset_mode="same_step")


@pytest.mark.parametrize("mode", ["next_step", "same_step", "disabled"])
def test_cartpole_smoke(mode):
    """Real CartPole: the contract holds, episodes end both ways, and a seed makes the stream repeat."""
    streams = []
    for _ in range(2):
        with envs.make("CartPole-v1", 3, autoreset_mode=mode, seed=1, max_episode_steps=16) as env:
            assert env.autoreset_mode is envs.to_autoreset_mode(mode)
            ts = env.reset()
            rng = np.random.default_rng(0)
            pending = np.zeros(3, bool)
            stream = []
            for _ in range(60):
                ts = env.step(rng.integers(0, 2, 3))
                check_contract(ts, 3)
                if mode == "next_step":
                    np.testing.assert_array_equal(ts.first, pending)
                    pending = ts.last.copy()
                else:
                    np.testing.assert_array_equal(ts.first, ts.last)
                    if ts.last.any():  # the reset observation is near the origin, the final one is not
                        assert not np.allclose(ts.observation[ts.last], ts.final_observation[ts.last])
                stream.append((ts.observation.copy(), ts.terminated, ts.truncated))
            assert any(s[1].any() for s in stream) and any(s[2].any() for s in stream)
            streams.append(stream)
    for a, b in zip(*streams, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


def test_cartpole_plain_env_via_make():
    with envs.make("CartPole-v1", None, seed=0) as env:
        assert env.num_envs == 1 and isinstance(env.env, gymnasium.Env)
        ts = env.reset()
        assert ts.observation.shape == (1, 4)
        for _ in range(40):
            ts = env.step(np.ones(1, np.int64))
            check_contract(ts, 1)
            if ts.last[0]:
                assert ts.first[0] and ts.final_observation.shape == (1, 4)
                break
        else:
            pytest.fail("pushing right for 40 steps should end the episode")


@pytest.mark.parametrize("maker", ["make", "atari"])
def test_async_workers_let_a_ctrl_c_pass_to_the_main_process(maker):
    """Ctrl-C signals every process of the terminal's group: the async workers ignore it (the main process's loop
    stops the run and closes them), so the envs go on stepping."""
    import os
    import signal

    if maker == "atari":
        pytest.importorskip("ale_py")
        env = envs.atari("ALE/Pong-v5", 2, seed=0, vectorization_mode="async")
    else:
        env = envs.make("CartPole-v1", 2, seed=0, vectorization_mode="async")
    with env:
        env.reset()
        for process in env.env.processes:
            os.kill(process.pid, signal.SIGINT)
        try:
            for _ in range(3):
                ts = env.step(np.zeros(2, np.int64))
        except KeyboardInterrupt:  # a worker's, sent back by gymnasium (it would end pytest's session)
            pytest.fail("an async worker raised KeyboardInterrupt on SIGINT")
        assert ts.observation.shape[0] == 2 and all(p.is_alive() for p in env.env.processes)
