"""The ReplayBuffer facade over random transition streams: nested observation spaces, ``add`` one step at a
time against ``extend``, both against a plain reference (tests/buffer_reference.py), and staging that never
loses a transition."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from buffer_reference import G, batch_row, draw, held, key, plan_stream, reference, stack
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow import ReplayBuffer
from rlflow.specs import SpecError

ACT = spaces.Discrete(4)


def _box(*shape: int) -> spaces.Box:
    return spaces.Box(-10, 10, shape, np.float32)


SPACES = {
    "box": _box(3),
    "dict": spaces.Dict({"pos": _box(2)}),
    "dict_mixed": spaces.Dict({"pos": _box(2), "id": spaces.Discrete(3)}),
    "tuple": spaces.Tuple((_box(2), _box(3))),
    "tuple_same_shapes": spaces.Tuple((_box(2), _box(2))),
    "nested_dict": spaces.Dict({"a": spaces.Dict({"x": _box(2), "k": spaces.Discrete(3)}), "b": _box(1)}),
    "tuple_of_dict": spaces.Tuple((spaces.Dict({"x": _box(2)}), spaces.Discrete(4))),
}
EVENTS = ["mid", "mid", "mid", "term", "trunc", "jump", "equal"]


def _add_all(buf: ReplayBuffer, per_env: list[list[tuple]], batched: bool) -> None:
    """Every step through ``add``: one env unbatched, or all envs batched (leading axis ``E``)."""
    for i in range(len(per_env[0])):
        row = [tr[i] for tr in per_env]
        if not batched:
            buf.add(*row[0])
        else:
            buf.add(*(stack([r[j] for r in row]) for j in range(4)), np.array([r[4] for r in row]),
                    np.array([r[5] for r in row]))


def _extend_all(buf: ReplayBuffer, per_env: list[list[tuple]], chunks: list[int]) -> None:
    """Every step through ``extend``, in chunks of the given sizes (``[T]`` for one env, ``[T, E]`` for more)."""
    t, e, i, c = len(per_env[0]), len(per_env), 0, 0
    while i < t:
        z = min(t, i + chunks[c % len(chunks)])
        c += 1
        steps = [[tr[s] for tr in per_env] for s in range(i, z)]
        cols = [stack([stack([r[j] for r in row]) if e > 1 else row[0][j] for row in steps]) for j in range(6)]
        buf.extend(*cols)
        i = z


def _filled_buffers(space: spaces.Space, per_env: list[list[tuple]], n: int, chunks: list[int],
                    close: bool) -> Iterator[tuple[str, ReplayBuffer]]:
    """``("add", buffer)`` and ``("extend", buffer)``: a buffer given every env's steps through ``add`` (one
    env unbatched, several batched) and one given them through ``extend`` in ``chunks``; episodes ended if
    ``close``."""
    envs = len(per_env)
    for path in ("add", "extend"):
        buf = ReplayBuffer(space, ACT, capacity=64 * envs, n_step=n, discount=G, num_envs=envs)
        if path == "add":
            _add_all(buf, per_env, batched=envs > 1)
        else:
            _extend_all(buf, per_env, chunks)
        if close:
            buf.end_episodes()
        yield path, buf


def _buffers_and_reference(space, plan, n, chunks, close, envs, seed):
    """The reference's transitions of ``envs`` streams made from ``plan``, and the buffers filled with them."""
    rng = np.random.default_rng(seed)
    per_env = [plan_stream(space, rng, plan) for _ in range(envs)]
    want = sorted(x for tr in per_env for x in reference(space, tr, n, close))
    return want, _filled_buffers(space, per_env, n, chunks, close)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(SPACES)), st.integers(1, 3), st.lists(st.sampled_from(EVENTS), min_size=1, max_size=40),
       st.lists(st.integers(1, 30), min_size=1, max_size=4), st.booleans(), st.sampled_from([1, 3]))
def test_nested_observations_through_add_and_extend_match_the_reference(name, n, plan, chunks, close, envs):
    """Dict, Tuple and nested observations, one env unbatched and several batched, through ``add`` and through
    ``extend``: each buffer holds exactly the reference's transitions; ``len`` and ``sample`` answer."""
    space = SPACES[name]
    want, filled = _buffers_and_reference(space, plan, n, chunks, close, envs, len(plan) + 7 * n)
    for path, buf in filled:
        assert held(buf, space) == want, path
        assert len(buf) == len(want)
        if want:
            batch = buf.sample(5).data
            assert {key(space, batch_row(batch.observation, i)) for i in range(5)} <= {w[0] for w in want}


def test_a_dict_observation_episode_end_inside_the_staged_block_is_kept():
    """One env, Dict observations: an episode ends and the next starts inside the staged block; ``len`` and
    ``sample`` write both episodes' transitions."""
    space = spaces.Dict({"pos": _box(2)})
    buf = ReplayBuffer(space, spaces.Discrete(2), capacity=100)

    def o(x):
        return {"pos": np.full(2, x, np.float32)}

    buf.add(o(0), 0, 1.0, o(1), True, False)
    buf.add(o(5), 1, 1.0, o(6), False, False)
    assert len(buf) == 2
    data = buf.sample(20).data
    assert sorted(data.observation["pos"][:, 0].tolist())[::19] == [0.0, 5.0]
    np.testing.assert_array_equal(data.next_observation["pos"], data.observation["pos"] + 1)  # each its own


@pytest.mark.parametrize("name", ["dict", "tuple", "nested_dict"])
def test_a_flush_that_fails_leaves_the_staged_transitions_staged(name, monkeypatch):
    """Should the write of the staged block raise, the block stays staged: the next flush writes it all."""
    space = SPACES[name]
    rng = np.random.default_rng(0)
    stream = plan_stream(space, rng, ["mid", "term", "mid", "mid", "trunc", "mid"])
    buf = ReplayBuffer(space, ACT, capacity=100, n_step=2, discount=G)
    for tr in stream:
        buf.add(*tr)
    write = buf.adder.write

    def fails(*args, **kwargs):
        raise RuntimeError("the store is not writable now")

    monkeypatch.setattr(buf.adder, "write", fails)
    with pytest.raises(RuntimeError, match="not writable"):
        len(buf)
    monkeypatch.setattr(buf.adder, "write", write)
    assert held(buf, space) == reference(space, stream, 2, False)


@pytest.mark.parametrize("name", ["dict", "tuple", "nested_dict"])
def test_bad_nested_input_raises_from_the_add_that_brought_it(name):
    """A nested observation of the wrong structure or a bad value raises from that ``add``; what was staged
    before is kept, and ``len`` answers."""
    space = SPACES[name]
    rng = np.random.default_rng(1)
    stream = plan_stream(space, rng, ["mid", "term", "mid"])
    buf = ReplayBuffer(space, ACT, capacity=100, discount=G)
    for tr in stream:
        buf.add(*tr)
    nxt = stream[-1][3]
    bad_structure = {"other": np.zeros(2, np.float32)} if isinstance(nxt, dict) else (np.zeros(2, np.float32),)
    for bad in (bad_structure, draw(space, rng)):
        with pytest.raises(SpecError):
            if bad is bad_structure:
                buf.add(nxt, 1, 1.0, bad, False, False)
            else:
                buf.add(bad, 9, 1.0, draw(space, rng), False, False)  # action out of bounds
    assert held(buf, space) == reference(space, stream, 1, False)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.lists(st.sampled_from([*EVENTS, "both", "both"]), min_size=1, max_size=50),
       st.lists(st.integers(1, 40), min_size=1, max_size=4), st.booleans(), st.sampled_from([1, 3]))
def test_add_and_extend_keep_the_same_transitions_of_any_stream(n, plan, chunks, close, envs):
    """The same stream (steps terminated, truncated, or both at once, as TimeLimit gives when an episode
    terminates at the limit) through ``add`` one step at a time and through ``extend`` in chunks: both
    buffers hold the same rows and transitions (the reference's, termination winning) and sample alike."""
    space = SPACES["box"]
    rng = np.random.default_rng(len(plan) + 11 * sum(chunks))
    per_env = [plan_stream(space, rng, plan) for _ in range(envs)]
    bufs = [ReplayBuffer(space, ACT, capacity=80 * envs, n_step=n, discount=G, num_envs=envs, seed=3) for _ in "ab"]
    _add_all(bufs[0], per_env, batched=envs > 1)
    _extend_all(bufs[1], per_env, chunks)
    if close:
        for buf in bufs:
            buf.end_episodes()
    want = sorted(x for tr in per_env for x in reference(space, tr, n, close))
    assert held(bufs[0], space) == held(bufs[1], space) == want
    for name, column in bufs[0].store.state_dict().items():
        np.testing.assert_array_equal(bufs[1].store.state_dict()[name], column, err_msg=name)
    if want:
        a, b = (buf.sample(16).data for buf in bufs)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


def test_a_step_both_terminated_and_truncated_is_terminated_in_every_path():
    """add (one env, several envs) and extend take a step marked both ways: it ends a terminated episode
    (discount 0)."""
    space = SPACES["box"]
    o, nxt = np.zeros(3, np.float32), np.ones(3, np.float32)
    one, many, ext = (ReplayBuffer(space, ACT, capacity=50, num_envs=e) for e in (1, 2, 1))
    one.add(o, 1, 1.0, nxt, True, True)
    many.add(np.stack([o, o]), np.array([1, 1]), np.ones(2), np.stack([nxt, nxt]), np.ones(2, bool), np.ones(2, bool))
    ext.extend(o[None], np.array([1]), np.ones(1), nxt[None], np.ones(1, bool), np.ones(1, bool))
    for buf in (one, many, ext):
        assert len(buf) == buf.num_envs and buf.sample(4).data.discount.tolist() == [0.0] * 4


@pytest.mark.parametrize("n", [1, 3])
def test_sample_with_nothing_sampleable_raises_at_once_saying_why(n):
    """A single-threaded loop never hangs in sample: with nothing sampleable it raises at once, saying what
    the buffer holds and when it becomes sampleable; the same buffer samples once it is."""
    from rlflow.replay import RateLimitTimeout

    buf = ReplayBuffer(SPACES["box"], ACT, capacity=50, n_step=n)
    with pytest.raises(RateLimitTimeout, match=r"sample\(8\): no transition is sampleable: the buffer holds none; "
                                               r"add transitions first, or pass timeout="):
        buf.sample(8)
    obs = np.zeros(3, np.float32)
    buf.add(obs, 1, 1.0, obs + 1, False, False)
    if n > 1:
        with pytest.raises(RateLimitTimeout, match=r"holds 1 transition\(s\) that wait .* n_step=3 .* once 2 more "
                                                   r".* end_episodes\(\)"):
            buf.sample(8)
        buf.add(obs + 1, 1, 1.0, obs + 2, False, False)
        with pytest.raises(RateLimitTimeout, match="holds 2 transition"):
            buf.sample(8, timeout=0.0)
        buf.end_episodes()
    assert buf.sample(8).data.observation.shape == (8, 3)


def test_sample_with_a_timeout_waits_for_another_threads_add():
    """timeout= keeps the blocking form for threaded use: a sample started before any add returns once
    another thread's transition is in (and a short timeout with nothing added raises, saying it waited)."""
    import threading

    from rlflow.replay import RateLimitTimeout

    buf = ReplayBuffer(SPACES["box"], ACT, capacity=50, num_envs=2)
    with pytest.raises(RateLimitTimeout, match=r"after waiting 0.01 s: the buffer holds none; add transitions "
                                               r"first$"):
        buf.sample(2, timeout=0.01)
    started = threading.Event()
    got = []

    def learner():
        started.set()
        got.append(buf.sample(2, timeout=None))

    thread = threading.Thread(target=learner)
    thread.start()
    started.wait()
    obs = np.zeros((2, 3), np.float32)
    buf.add(obs, np.array([1, 2]), np.ones(2), obs + 1, np.zeros(2, bool), np.zeros(2, bool))
    thread.join(timeout=60)
    assert not thread.is_alive() and got[0].data.action.shape == (2,)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["box", "dict_mixed", "tuple", "nested_dict"]), st.integers(1, 3),
       st.lists(st.sampled_from([*EVENTS, "both", "reset", "reset", "reset"]), min_size=1, max_size=40),
       st.lists(st.integers(1, 30), min_size=1, max_size=4), st.booleans(), st.sampled_from([1, 3]))
def test_next_step_reset_steps_are_not_transitions_in_add_and_extend(name, n, plan, chunks, close, envs):
    """Streams with gymnasium's NEXT_STEP reset steps (after an end: obs is the end's next_obs, reward 0,
    no flag), and the same shapes of step where no episode ended (kept): ``add`` one step at a time and
    ``extend`` in chunks hold exactly the reference's transitions, never a reset step."""
    space = SPACES[name]
    want, filled = _buffers_and_reference(space, plan, n, chunks, close, envs, len(plan) + 13 * n)
    for path, buf in filled:
        assert held(buf, space) == want, path


def test_a_same_step_loop_whose_episode_restarts_at_its_final_observation_keeps_its_first_step_with_infos():
    """A loop that resets the env itself, whose new episode starts exactly at the final observation with a
    reward-0 first step: taken as a NEXT_STEP reset step without infos; kept when the ending call passes
    the final observation in infos (one env and several, gymnasium's and Stable-Baselines3's forms)."""
    space = spaces.Discrete(3)
    stream = [(0, 1, 1.0, 1, False, False), (1, 1, 1.0, 0, False, True),  # truncated at observation 0...
              (0, 2, 0.0, 2, False, False)]                                # ...and the reset observation is 0
    for infos in (None, {"final_obs": 0}):
        buf = ReplayBuffer(space, ACT, capacity=20, discount=G)
        for i, tr in enumerate(stream):
            buf.add(*tr, **({"infos": infos} if infos is not None and i == 1 else {}))
        assert len(buf) == (2 if infos is None else 3)
    for infos in ({"final_obs": np.array([0, 0], object), "_final_obs": np.array([True, False])},
                  [{"terminal_observation": 0}, {}]):
        buf = ReplayBuffer(space, ACT, capacity=40, num_envs=2, discount=G)
        for i, tr in enumerate(stream):
            cols = [np.array([x, x]) for x in tr]
            buf.add(*cols, **({"infos": infos} if i == 1 else {}))
        assert len(buf) == 6 - 1  # env 1 had no final observation in infos: its step 3 is a reset step


def test_bad_infos_raise_and_change_nothing():
    space = SPACES["box"]
    buf = ReplayBuffer(space, ACT, capacity=40, num_envs=2)
    o = np.zeros((2, 3), np.float32)
    args = (o, np.array([1, 1]), np.ones(2), o + 1, np.ones(2, bool), np.zeros(2, bool))
    for infos, match in (([{}], "one info dict per env"), ("final", "info dict"),
                         ({"final_obs": np.array([None] * 3, object)}, "one entry per env"),
                         ({"final_obs": np.array([np.zeros(4), None], object), "_final_obs": np.array([True, False])},
                          r"final observations of envs \[0\] do not fit")):
        with pytest.raises(SpecError, match=match):
            buf.add(*args, infos=infos)
        assert len(buf) == 0 and len(buf.store) == 0


def test_waiting_actions_count_the_actions_no_item_holds_yet():
    """n=3, two envs: 1, then 2 actions wait per env (at most n - 1); an episode end leaves none waiting."""
    buf = ReplayBuffer(SPACES["box"], ACT, capacity=40, num_envs=2, n_step=3)
    obs = np.zeros((2, 3), np.float32)
    counts = []
    for end in ([False, False], [False, False], [False, False], [True, False]):
        buf.add(obs, np.array([1, 1]), np.ones(2), obs + 1, np.array(end), np.zeros(2, bool))
        obs = obs + 1
        counts.append(buf.adder.waiting_actions().tolist())
    assert counts == [[1, 1], [2, 2], [2, 2], [0, 2]]
    assert len(buf) == 4 + 2  # env 0: its 4 actions; env 1: the first 2 of its 4


@pytest.mark.parametrize("envs", [1, 2])
def test_a_bad_call_after_an_episode_end_leaves_the_reset_step_recognised(envs):
    """After an end, a call that raises changes nothing: the reset step that follows is still left out."""
    space = SPACES["box"]
    buf = ReplayBuffer(space, ACT, capacity=40, num_envs=envs)
    o = np.zeros((envs, 3), np.float32)

    def add(obs, action, reward, nxt, term):
        args = (obs, np.full(envs, action), np.full(envs, reward), nxt, np.full(envs, term), np.zeros(envs, bool))
        buf.add(*(a[0] for a in args) if envs == 1 else args)

    add(o, 1, 1.0, o + 1, True)
    with pytest.raises(SpecError):
        add(o + np.nan, 1, 0.0, o + 2, False)  # not a finite observation
    add(o + 1, 1, 0.0, o + 2, False)  # the reset step: next_obs o + 2 starts the next episode
    add(o + 2, 1, 1.0, o + 3, False)
    assert len(buf) == 2 * envs and sorted(buf.sample(16).data.observation[:, 0].tolist())[::15] == [0.0, 2.0]
