"""Frame stacks stored once (``Field(stack=k)``): every stack a sample returns is the stack gymnasium's
``FrameStackObservation`` produced for that row of the stream, across episode starts, truncations, ring
wrap-around, lanes, item kinds and samplers; bad stacks are refused with nothing written.

The reference is the stream itself: every row each lane writes (its first observation, each next
observation, each final observation), recorded as the env wrapper handed it over, indexed by the row's
absolute index in its lane.
"""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import FrameStackObservation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlflow import ReplayBuffer, adders, replay, specs
from rlflow.envs import GymEnvironment
from rlflow.replay import Fifo, Prioritized, StepStore, Table, Uniform
from rlflow.specs import Field, SpecError
from rlflow.types import TimeStep, step_spec


class Frames(gym.Env):
    """Frames ``(2, 3)`` uint8 that name their episode and step (plus noise); episodes of 1-8 steps, the even
    ones terminated, the odd ones truncated."""

    def __init__(self, seed: int = 0) -> None:
        self.observation_space = gym.spaces.Box(0, 255, (2, 3), np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.rng = np.random.default_rng(seed)
        self.episode = self.t = self.length = 0

    def frame(self) -> np.ndarray:
        f = np.zeros((2, 3), np.uint8)
        f[0, 0], f[0, 1] = self.episode % 256, self.t % 256
        f[1] = self.rng.integers(0, 256, 3)
        return f

    def reset(self, seed=None, options=None):
        self.episode += 1
        self.t, self.length = 0, int(self.rng.integers(1, 9))
        return self.frame(), {}

    def step(self, action):
        self.t += 1
        end = self.t >= self.length
        return self.frame(), 1.0, end and self.episode % 2 == 0, end and self.episode % 2 == 1, {}


def make_env(k: int, lanes: int, seed: int, padding: str = "reset") -> GymEnvironment:
    venv = gym.vector.SyncVectorEnv(
        [lambda i=i: FrameStackObservation(Frames(seed * 10 + i), k, padding_type=padding) for i in range(lanes)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    return GymEnvironment(venv, frame_stack=k)


def record(ref: list[list[np.ndarray]], ts: TimeStep) -> None:
    """Append the rows an adder writes for ``ts`` to each lane's list (final observation, then next one)."""
    for e in range(len(ref)):
        if ts.last[e]:
            ref[e].append(ts.final_observation[e].copy())
        if ts.first[e] or not ts.last[e]:
            ref[e].append(ts.observation[e].copy())


def run(env: GymEnvironment, adder: adders.Adder, steps: int, *, staged: bool, check=None, every: int = 5):
    """Drive ``adder`` for ``steps`` env steps; return the rows each lane wrote. ``check(ref)`` runs every
    ``every`` steps (after a flush)."""
    ts = env.reset(seed=0)
    adder.add_first(ts)
    ref = [[ts.observation[e].copy()] for e in range(env.num_envs)]
    actions = np.zeros(env.num_envs, np.int64)
    for t in range(steps):
        ts = env.step(actions)
        (adder.stage if staged else adder.add)(actions, ts)
        record(ref, ts)
        if check is not None and t % every == every - 1:
            adder.flush()
            check(ref)
    adder.flush()
    if check is not None:
        check(ref)
    return ref


def sampler(prioritized: bool):
    return Prioritized(alpha=0.6, seed=1) if prioritized else Uniform(seed=1)


def check_transitions(table: Table, ref, batch: int = 32):
    if not table.size:
        return
    s = table.sample(batch)
    for i in range(batch):
        lane, start, length = int(s.lanes[i]), int(s.starts[i]), int(s.lengths[i])
        np.testing.assert_array_equal(s.data.observation[i], ref[lane][start])
        np.testing.assert_array_equal(s.data.next_observation[i], ref[lane][start + length - 1])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(2, 4), lanes=st.integers(1, 3), n=st.integers(1, 3), spare=st.integers(0, 12),
       prioritized=st.booleans(), staged=st.booleans(), seed=st.integers(0, 50))
def test_nstep_samples_are_the_wrappers_stacks(k, lanes, n, spare, prioritized, staged, seed):
    env = make_env(k, lanes, seed)
    store = StepStore(step_spec(env.observation_spec, env.action_spec), capacity=n + k + 2 + spare, lanes=lanes)
    table = Table(store, sampler=sampler(prioritized), remover=Fifo())
    adder = adders.NStepTransition(store, [table], n=n, discount=0.9, stage_steps=4)
    run(env, adder, 120, staged=staged, check=lambda ref: check_transitions(table, ref))
    assert store.count.min() > store.capacity  # the rings wrapped


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(2, 4), lanes=st.integers(1, 3), length=st.integers(2, 5), period=st.integers(1, 5),
       spare=st.integers(0, 10), prioritized=st.booleans(), seed=st.integers(0, 50))
def test_sequence_samples_are_the_wrappers_stacks(k, lanes, length, period, spare, prioritized, seed):
    env = make_env(k, lanes, seed)
    store = StepStore(step_spec(env.observation_spec, env.action_spec), capacity=length + k + 2 + spare,
                      lanes=lanes)
    table = Table(store, sampler=sampler(prioritized), remover=Fifo())
    adder = adders.Sequence(store, [table], length=length, period=min(period, length))

    def check(ref):
        if not table.size:
            return
        s = table.sample(16)
        obs, mask = s.data["observation"], s.mask
        assert obs.shape == (16, length, k, 2, 3)
        for i in range(16):
            for t in range(length):
                if mask[i, t]:
                    np.testing.assert_array_equal(obs[i, t], ref[int(s.lanes[i])][int(s.starts[i]) + t])
                else:
                    assert not obs[i, t].any()

    run(env, adder, 120, staged=False, check=check)


@pytest.mark.parametrize("ragged", [False, True])
def test_episode_samples_are_the_wrappers_stacks(ragged):
    env = make_env(3, 2, seed=3)
    store = StepStore(step_spec(env.observation_spec, env.action_spec), capacity=24, lanes=2)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo())
    adder = adders.Episode(store, [table], max_length=10, ragged=ragged)

    def check(ref):
        if not table.size:
            return
        s = table.sample(8)
        for i in range(8):
            obs = s.data[i]["observation"] if ragged else s.data["observation"][i]
            valid = len(obs) if ragged else int(s.mask[i].sum())
            for t in range(valid):
                np.testing.assert_array_equal(obs[t], ref[int(s.lanes[i])][int(s.starts[i]) + t])

    run(env, adder, 150, staged=False, check=check)


def test_a_stack_is_rebuilt_from_single_frames_by_hand():
    """One lane, k=3, frames numbered 1, 2, ...: the stacks of an episode's rows are [1 1 1], [1 1 2],
    [1 2 3], [2 3 4]; the next episode starts again at its own first frame."""
    frame = Field((3, 1), np.uint8, stack=3)
    store = StepStore(step_spec(frame, Field((), np.int64)), capacity=8)
    table = Table(store, sampler=Fifo(), remover=Fifo())
    adder = adders.NStepTransition(store, [table], n=1, discount=1.0)

    def ts(stack, *, first=False, last=False, final=None):
        flag = np.array([first]), np.array([last])
        obs = np.array(stack, np.uint8).reshape(1, 3, 1)
        fin = None if final is None else np.array(final, np.uint8).reshape(1, 3, 1)
        return TimeStep(obs, np.zeros(1, np.float32), flag[1], np.zeros(1, bool), flag[0], flag[1], fin)

    adder.add_first(ts([1, 1, 1], first=True))
    for stack in ([1, 1, 2], [1, 2, 3], [2, 3, 4]):
        adder.add(np.zeros(1, np.int64), ts(stack))
    adder.add(np.zeros(1, np.int64), ts([5, 5, 5], first=True, last=True, final=[3, 4, 9]))
    assert store.columns["observation"][0, :6, 0].tolist() == [1, 2, 3, 4, 9, 5]
    rows = store.gather(np.zeros(6, np.int64), np.arange(6))["observation"][..., 0]
    assert rows.tolist() == [[1, 1, 1], [1, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 9], [5, 5, 5]]


def test_items_whose_stacks_lose_a_row_go_with_the_overwritten_rows():
    """Capacity 8, k=4, one long episode: when row r is overwritten, the items starting at r + 1 .. r + 3 (whose
    stacks read row r) go too, and reading those rows raises."""
    frame = Field((4, 1), np.uint8, stack=4)
    store = StepStore(step_spec(frame, Field((), np.int64)), capacity=8)
    table = Table(store, sampler=Fifo(), remover=Fifo())
    adder = adders.NStepTransition(store, [table], n=1, discount=1.0)
    obs = lambda f: np.array(f, np.uint8).reshape(1, 4, 1)  # noqa: E731
    no = np.zeros(1, bool)
    adder.add_first(TimeStep(obs([1, 1, 1, 1]), np.zeros(1, np.float32), no, no, np.ones(1, bool), no))
    frames = [1, 1, 1, 1]
    for t in range(2, 13):
        frames = [*frames[1:], t]
        adder.add(np.zeros(1, np.int64), TimeStep(obs(frames), np.zeros(1, np.float32), no, no, no, no))
    # 12 rows written: rows 4..11 stored; row r reads rows r-3..r, so rows 4..6 cannot be read, and the
    # items (windows of 2 rows) that start at 7..10 are all that is left.
    assert table.size == 4 and table.sample(1).starts.tolist() == [7]  # the oldest (Fifo) of four
    assert store.gather([0], [7])["observation"][0, :, 0].tolist() == [5, 6, 7, 8]
    with pytest.raises(IndexError, match="frame stacks read rows no longer stored"):
        store.gather([0], [6])
    with pytest.raises(IndexError, match="not stored"):
        store.gather([0], [3])
    windows = Table(store, sampler=Uniform(), remover=Fifo(), name="windows")  # items by hand: refused alike
    with pytest.raises(ValueError, match="starts at a row whose frame stacks read rows no longer stored"):
        windows.insert([0, 0], [7, 6], [2, 2])
    assert windows.size == 0
    windows.insert([0], [7], [4])
    with pytest.raises(IndexError, match="not stored"):
        store.gather_windows([0], [5], [2])
    data, mask = store.gather_windows([0], [7], [2])
    assert data["observation"][0, :, :, 0].tolist() == [[5, 6, 7, 8], [6, 7, 8, 9]] and mask.all()


def test_memory_is_one_frame_a_row():
    k, frame = 4, (84, 84)
    stacked = StepStore(step_spec(Field((k, *frame), np.uint8, stack=k), Field((), np.int64)), capacity=100)
    plain = StepStore(step_spec(Field((k, *frame), np.uint8), Field((), np.int64)), capacity=100)
    assert stacked.columns["observation"].nbytes == 100 * 84 * 84
    assert plain.columns["observation"].nbytes == k * stacked.columns["observation"].nbytes


def test_replay_buffer_takes_a_stacked_observation_spec():
    k = 3
    env = make_env(k, 1, seed=4)
    buffer = ReplayBuffer(env.observation_spec, env.action_spec, capacity=40, n_step=2, seed=0)
    ts = env.reset(seed=0)
    ref = [[ts.observation[0].copy()]]
    obs = ts.observation
    for _ in range(100):
        action = np.zeros(1, np.int64)
        ts = env.step(action)
        next_obs = np.where(ts.last[:, None, None, None], ts.final_observation if ts.last.any() else ts.observation,
                            ts.observation)
        buffer.add(obs, action, ts.reward, next_obs, ts.terminated, ts.truncated)
        record(ref, ts)
        obs = ts.observation
    s = buffer.sample(16)
    assert s.data.observation.shape == (16, k, 2, 3)
    for i in range(16):
        lane, start, length = int(s.lanes[i]), int(s.starts[i]), int(s.lengths[i])
        np.testing.assert_array_equal(s.data.observation[i], ref[lane][start])
        np.testing.assert_array_equal(s.data.next_observation[i], ref[lane][start + length - 1])


# ---------------------------------------------------------------------------------------------- bad input


def test_field_stack_is_checked():
    with pytest.raises(SpecError, match="axis 0 holds the 4 frames"):
        Field((84, 84, 4), np.uint8, stack=4)
    with pytest.raises(SpecError, match="integer >= 1"):
        Field((4, 2), np.uint8, stack=0)
    with pytest.raises(SpecError, match="integer >= 1"):
        Field((1, 2), np.uint8, stack=True)
    with pytest.raises(SpecError, match="single-agent"):
        specs.add_agent_axis(Field((4, 2), np.uint8, stack=4), 3)
    with pytest.raises(SpecError, match="FrameStackObservation"):
        specs.frame_stack(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), 4)
    assert specs.frame_stack(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), 4).frame_shape == (84, 84)
    with pytest.raises(ValueError, match="exceed the frames of a stack"):
        StepStore(step_spec(Field((4, 2), np.uint8, stack=4), Field((), np.int64)), capacity=4)


def test_env_without_frame_stacks_is_refused():
    venv = gym.vector.SyncVectorEnv([lambda: Frames()])
    with pytest.raises(SpecError, match=r"FrameStackObservation\(env, 4\)"):
        GymEnvironment(venv, frame_stack=4)


def test_direct_writes_of_stacks_are_refused():
    store = StepStore(step_spec(Field((2, 1), np.uint8, stack=2), Field((), np.int64)), capacity=8)
    row = {"observation": np.zeros((1, 2, 1), np.uint8), "action": np.zeros(1, np.int64),
           "reward": np.zeros(1, np.float32), **{f: np.zeros(1, bool) for f in ("terminated", "truncated",
                                                                                 "first", "last")}}
    with pytest.raises(SpecError, match="through an adder"):
        store.append(row, first=np.ones(1, bool))
    assert store.count.tolist() == [0]


def test_zero_padded_stacks_are_refused_with_nothing_written():
    env = make_env(4, 2, seed=0, padding="zero")  # FrameStackObservation's zero padding: the episode starts with 0s
    store = StepStore(step_spec(env.observation_spec, env.action_spec), capacity=16, lanes=2)
    table = Table(store, sampler=Uniform(), remover=Fifo())
    adder = adders.NStepTransition(store, [table], n=1)
    with pytest.raises(SpecError, match=r"not its first frame repeated 4 times.*padding_type='reset'"):
        adder.add_first(env.reset(seed=0))
    assert store.count.tolist() == [0, 0] and table.size == 0


def counts_after(steps: int) -> list[int]:
    """The rows each lane holds after ``steps`` good steps of :func:`test_a_stack_that_does_not_continue_is_refused`'s
    stream."""
    env = make_env(3, 2, seed=2)
    store = StepStore(step_spec(env.observation_spec, env.action_spec), capacity=64, lanes=2)
    adder = adders.NStepTransition(store, [Table(store, sampler=Uniform(), remover=Fifo())], n=1)
    adder.add_first(env.reset(seed=0))
    for _ in range(steps):
        adder.add(np.zeros(2, np.int64), env.step(np.zeros(2, np.int64)))
    return store.count.tolist()


@pytest.mark.parametrize("staged", [False, True])
def test_a_stack_that_does_not_continue_is_refused(staged):
    """Step 5 of lane 1 (a step inside an episode) hands over a stack whose older frames are not the stack
    before it: the step is refused when it is added (staged or not), nothing of it is added, the steps
    before it stay as they were, and the step as the env gave it goes on from there."""
    env = make_env(3, 2, seed=2)
    store = StepStore(step_spec(env.observation_spec, env.action_spec), capacity=64, lanes=2)
    table = Table(store, sampler=Uniform(), remover=Fifo())
    adder = adders.NStepTransition(store, [table], n=1, stage_steps=8)
    adder.add_first(env.reset(seed=0))
    actions = np.zeros(2, np.int64)
    add = adder.stage if staged else adder.add
    error = r"'observation' \(stacks of 3 frames\) of lanes \[1\]: the stack does not continue.*FrameStackObservation"
    for t in range(7):
        ts = env.step(actions)
        if t == 5:
            assert not ts.first[1] and not ts.last[1]
            bad = dataclasses.replace(ts, observation=ts.observation.copy())
            bad.observation[1, 0] += 1  # lane 1's oldest frame changed
            before = (store.count.tolist(), table.size, adder.staged_steps)
            with pytest.raises(SpecError, match=error):
                add(actions, bad)
            assert (store.count.tolist(), table.size, adder.staged_steps) == before
        add(actions, ts)
    adder.flush()
    assert store.count.tolist() == counts_after(7)

def test_checkpoint_round_trip_and_a_store_without_stacks_refuses_it(tmp_path):
    env = make_env(3, 2, seed=5)
    spec = step_spec(env.observation_spec, env.action_spec)
    store = StepStore(spec, capacity=20, lanes=2)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo())
    adder = adders.NStepTransition(store, [table], n=2)
    ref = run(env, adder, 60, staged=True)
    path = replay.save(tmp_path / "stacks.rlflow", store, [table])

    again = StepStore(spec, capacity=20, lanes=2)
    table2 = Table(again, sampler=Uniform(seed=0), remover=Fifo())
    adders.NStepTransition(again, [table2], n=2)
    replay.load(path, again, [table2])
    check_transitions(table2, ref)

    plain = {**spec, "observation": dataclasses.replace(spec["observation"], stack=1)}
    other = StepStore(plain, capacity=20, lanes=2)
    with pytest.raises(replay.CheckpointError):
        replay.load(path, other, [])
    assert other.count.tolist() == [0, 0]


@pytest.mark.parametrize(("game", "episodic_life"), [("ALE/Pong-v5", False), ("ALE/Breakout-v5", True)])
def test_atari_stacks_through_the_store(game, episodic_life):
    """A real game: envs.atari's preprocessing and stacks (noop resets, sticky actions, an episode a life) pass
    the write checks, and every sampled stack is the stack the env handed over."""
    from rlflow import envs

    env = envs.atari(game, num_envs=2, seed=0, episodic_life=episodic_life)
    assert env.observation_spec.shape == (4, 84, 84) and env.observation_spec.stack == 4
    store = StepStore(step_spec(env.observation_spec, env.action_spec), capacity=100, lanes=2)
    assert store.nbytes == 2 * 100 * 84 * 84 + store.nbytes - store.columns["observation"].nbytes
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo())
    adder = adders.NStepTransition(store, [table], n=3, discount=0.99)
    rng = np.random.default_rng(0)
    ts = env.reset(seed=0)
    adder.add_first(ts)
    ref = [[ts.observation[e].copy()] for e in range(2)]
    ends = 0
    for _ in range(150):
        actions = rng.integers(0, env.action_spec.high + 1, 2)
        ts = env.step(actions)
        adder.stage(actions, ts)
        record(ref, ts)
        ends += int(ts.last.sum())
    env.close()
    check_transitions(table, ref)
    assert store.count.min() > store.capacity
    assert ends >= 2 or not episodic_life  # Breakout's lives lost, within the ring


def test_atari_without_the_extra_names_it(monkeypatch):
    import builtins

    from rlflow import envs

    real = builtins.__import__

    def no_ale(name, *args, **kwargs):
        if name == "ale_py":
            raise ImportError("No module named 'ale_py'", name="ale_py")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ale)
    with pytest.raises(ImportError, match=r'pip install "rlflow\[atari\]"'):
        envs.atari("ALE/Pong-v5")


def test_a_disk_store_rebuilds_the_same_stacks(tmp_path):
    env = make_env(3, 2, seed=7)
    store = StepStore(step_spec(env.observation_spec, env.action_spec), capacity=20, lanes=2, backend="disk",
                      directory=tmp_path / "store")
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo())
    adder = adders.NStepTransition(store, [table], n=2)
    run(env, adder, 80, staged=True, check=lambda ref: check_transitions(table, ref))
    assert store.count.min() > store.capacity
    assert np.load(tmp_path / "store" / "column_0000.npy", mmap_mode="r").shape == (2, 20, 2, 3)


def test_only_observations_hold_frame_stacks():
    with pytest.raises(SpecError, match=r"fields \['extras'\] declare frame stacks"):
        StepStore(step_spec(Field((2,), np.float32), Field((), np.int64), extras=Field((3, 2), np.float32, stack=3)),
                  capacity=8)


def test_extend_and_add_steps_refuse_a_bad_stack_with_nothing_added():
    """ReplayBuffer.extend of two envs whose env 1 hands over a next_obs that does not continue its obs, and
    add_steps with such a step: each raises, and no env's rows or items are added."""
    k = 3
    frames = np.arange(40, dtype=np.uint8).reshape(40, 1, 1)
    stacks = np.stack([frames[np.maximum(np.arange(t - k + 1, t + 1), 0)] for t in range(40)])  # [40, 3, 1, 1]
    spec = Field((k, 1, 1), np.uint8, stack=k)
    buffer = ReplayBuffer(spec, Field((), np.int64), capacity=200, num_envs=2)
    obs = np.stack([stacks[:10], stacks[:10]], 1)
    nxt = np.stack([stacks[1:11], stacks[1:11]], 1).copy()
    nxt[6, 1, 0] += 1
    no = np.zeros((10, 2), bool)
    with pytest.raises(SpecError, match=r"extend: next_obs\[6\]: field 'observation' .* of lanes \[1\]: the stack "
                                        r"does not continue"):
        buffer.extend(obs, np.zeros((10, 2), np.int64), np.zeros((10, 2), np.float32), nxt, no, no)
    assert buffer.store.count.tolist() == [0, 0] and len(buffer) == 0
    buffer.extend(obs, np.zeros((10, 2), np.int64), np.zeros((10, 2), np.float32),
                  np.stack([stacks[1:11], stacks[1:11]], 1), no, no)
    assert len(buffer) == 20

    store = StepStore(step_spec(spec, Field((), np.int64)), capacity=64)
    table = Table(store, sampler=Uniform(), remover=Fifo())
    adder = adders.NStepTransition(store, [table], n=1)
    adder.add_first(TimeStep(stacks[:1], np.zeros(1, np.float32), np.zeros(1, bool), np.zeros(1, bool),
                             np.ones(1, bool), np.zeros(1, bool)))
    bad = stacks[1:9].copy()
    bad[4, 0] += 1
    with pytest.raises(SpecError, match=r"add_steps: next_observations\[4\].*does not continue"):
        adder.add_steps(0, np.zeros(8, np.int64), np.zeros(8, np.float32), bad)
    assert store.count.tolist() == [1] and table.size == 0


def _feed(buffer: ReplayBuffer, how: str, obs: np.ndarray, nxt: np.ndarray) -> None:
    """Three steps, the second ending its episode, the third a reset step (reward 0, neither flag): one extend,
    or three adds."""
    term, rewards = np.array([False, True, False]), np.array([1.0, 1.0, 0.0], np.float32)
    if how == "extend":
        buffer.extend(obs, np.zeros(3, np.int64), rewards, nxt, term, np.zeros(3, bool))
        return
    for i in range(3):
        buffer.add(obs[i], 0, float(rewards[i]), nxt[i], bool(term[i]), False)


@pytest.mark.parametrize("how", ["add", "extend"])
def test_the_episode_a_reset_step_starts_must_begin_with_repeated_frames(how):
    """After an episode end, a NEXT_STEP reset step (obs is the end's next_obs, reward 0, neither flag) starts the
    next episode at its next_obs: add and extend both refuse one whose frames are not its first frame repeated,
    adding nothing of the call, and take the same stream with a proper first observation."""
    k = 3
    frames = np.arange(1, 11, dtype=np.uint8).reshape(10, 1, 1)
    stacks = np.stack([frames[np.maximum(np.arange(t - k + 1, t + 1), 0)] for t in range(10)])  # [10, 3, 1, 1]
    start = np.repeat(frames[5:6], k, axis=0)  # the next episode's first observation: frame 6 three times
    spec = Field((k, 1, 1), np.uint8, stack=k)
    for good in (False, True):
        buffer = ReplayBuffer(spec, Field((), np.int64), capacity=64)
        reset_next = start if good else stacks[5]  # a stack that goes on, not a new episode's first observation
        obs = np.stack([stacks[0], stacks[1], stacks[2]])
        nxt = np.stack([stacks[1], stacks[2], reset_next])
        obs[2] = stacks[2]  # step 2 is the reset step: its obs is step 1's next_obs, reward 0, neither flag
        if good:
            _feed(buffer, how, obs, nxt)
            assert len(buffer) == 2
            continue
        with pytest.raises(SpecError, match="first frame repeated"):
            _feed(buffer, how, obs, nxt)
        assert len(buffer) == (2 if how == "add" else 0)  # add kept the calls before the refused one


@pytest.mark.parametrize("change", ["continues", "starts"])
def test_a_block_from_elsewhere_whose_stacks_do_not_follow_is_refused_whole(change):
    """A remote actor's block is checked again when written: one whose stacks were changed after they were put
    (a stack inside an episode that no longer continues the one before it, or an episode's first stack that is
    no longer its first frame repeated) raises, and nothing of it is written."""
    from rlflow.adders import StepBlock

    env = make_env(3, 2, seed=2)
    store = StepStore(step_spec(env.observation_spec, env.action_spec), capacity=64, lanes=2)
    table = Table(store, sampler=Uniform(), remover=Fifo())
    adder = adders.NStepTransition(store, [table], n=1)
    block = StepBlock(store.spec, [0, 1], 4)
    actions = np.zeros(2, np.int64)
    if change == "continues":
        adder.add_first(env.reset(seed=0))
        block.start(np.ones(2, bool), None, adder.open_stacks())
    else:  # the block's first step starts the lanes' episodes
        block.start(np.zeros(2, bool))
        block.put(actions, env.reset(seed=0))
    while block.steps < 4:
        block.put(actions, env.step(actions))
    if change == "continues":
        block.observation["observation"][3, 1, 0] += 1  # changed after it was put (a step inside an episode)
        words = r"the stack does not continue"
    else:
        block.observation["observation"][0, 1, 0] += 1  # the oldest frame: the next stack does not hold it
        words = r"starts an episode with a stack that is not its first frame repeated"
    before = (store.count.tolist(), table.size)
    with pytest.raises(RuntimeError, match=rf"write: .*lane 1.*{words}.*nothing was written"):
        adder.write(block)
    assert (store.count.tolist(), table.size) == before


@pytest.mark.parametrize("where", [0, 5])
def test_extend_refuses_an_episode_that_starts_without_repeated_frames(where):
    """An extend step whose obs starts an episode (the first of a fresh buffer, or the step after an episode end
    whose obs is not that end's next_obs) must hold its first frame repeated: extend names that obs and adds
    nothing; with a proper first stack the same call is taken."""
    k = 3
    frames = np.arange(1, 21, dtype=np.uint8).reshape(20, 1, 1)
    stacks = np.stack([frames[np.maximum(np.arange(t - k + 1, t + 1), 0)] for t in range(20)])  # [20, 3, 1, 1]
    buffer = ReplayBuffer(Field((k, 1, 1), np.uint8, stack=k), Field((), np.int64), capacity=100)
    obs, nxt = stacks[:8].copy(), stacks[1:9].copy()
    term = np.zeros(8, bool)
    term[4] = True  # step 5 starts the next episode at its obs
    obs[5] = np.repeat(frames[12:13], k, axis=0)
    nxt[5] = np.concatenate([obs[5][1:], frames[13:14]])
    nxt[6], obs[6] = np.concatenate([nxt[5][1:], frames[14:15]]), nxt[5]
    nxt[7], obs[7] = np.concatenate([nxt[6][1:], frames[15:16]]), nxt[6]
    bad_obs, bad_nxt = obs.copy(), nxt.copy()
    bad_obs[where, 0] += 1  # no longer its first frame repeated (and next_obs still continues it)
    bad_nxt[where] = np.concatenate([bad_obs[where][1:], nxt[where][-1:]])
    if where > 0:
        bad_obs[where + 1] = bad_nxt[where]
        bad_nxt[where + 1] = np.concatenate([bad_nxt[where][1:], nxt[where + 1][-1:]])
        bad_obs[where + 2] = bad_nxt[where + 1]
        bad_nxt[where + 2, :-1] = bad_nxt[where + 1, 1:]
    args = (np.zeros(8, np.int64), np.ones(8, np.float32))
    with pytest.raises(SpecError, match=rf"extend: obs\[{where}\]: field 'observation' .* starts an episode with a "
                                        r"stack that is not its first frame repeated"):
        buffer.extend(bad_obs, *args, bad_nxt, term, np.zeros(8, bool))
    assert buffer.store.count.tolist() == [0] and len(buffer) == 0
    buffer.extend(obs, *args, nxt, term, np.zeros(8, bool))
    assert len(buffer) == 8
