"""The ReplayBuffer facade fed by the obvious loop over real gymnasium vector envs, in every autoreset mode:
it holds exactly the transitions of the true episodes (replayed on single envs), never a reset step."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from buffer_reference import G, held, reference
from gymnasium.vector import AutoresetMode

from rlflow import ReplayBuffer

ENV_ID, LIMIT, ENVS, STEPS, SEED = "CartPole-v1", 16, 3, 90, 5
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


def _vector(mode: AutoresetMode) -> gym.vector.VectorEnv:
    return gym.make_vec(ENV_ID, num_envs=ENVS, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode},
                        max_episode_steps=LIMIT)


def _actions() -> np.ndarray:
    return np.random.default_rng(SEED).integers(0, 2, (STEPS, ENVS))


def _true_episodes(mode: AutoresetMode) -> list[list[tuple]]:
    """Per env, the transitions the vector env's sub-env really made, replayed on a single env: the same
    seed, the actions the sub-env took (under NEXT_STEP the action of a reset step is not taken)."""
    out = []
    for i in range(ENVS):
        env = gym.make(ENV_ID, max_episode_steps=LIMIT)
        obs, _ = env.reset(seed=SEED + i)
        transitions, resets_next = [], False
        for action in _actions()[:, i]:
            if resets_next:  # NEXT_STEP: this call resets the sub-env
                obs, _ = env.reset()
                resets_next = False
                continue
            nxt, reward, term, trunc, _ = env.step(int(action))
            transitions.append((obs, int(action), float(reward), nxt, bool(term), bool(trunc)))
            obs = nxt
            if term or trunc:
                if mode is AutoresetMode.NEXT_STEP:
                    resets_next = True
                else:
                    obs, _ = env.reset()
        env.close()
        out.append(transitions)
    return out


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("with_infos", [False, True])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_the_obvious_vector_loop_stores_the_true_transitions(mode, with_infos, n):
    """``buffer.add(obs, actions, rewards, next_obs, terminated, truncated)`` after each ``vec.step`` (with
    ``infos=`` too: needed under SAME_STEP, where next_obs of an ended env is already its reset observation),
    ``obs = next_obs`` (DISABLED: then the reset of the ended envs): the buffer holds the true episodes'
    transitions."""
    if mode is AutoresetMode.SAME_STEP and not with_infos:
        pytest.skip("SAME_STEP's true final observations are only in infos")
    vec = _vector(mode)
    space = vec.single_observation_space
    buf = ReplayBuffer(space, vec.single_action_space, capacity=400 * ENVS, n_step=n, discount=G, num_envs=ENVS)
    obs, _ = vec.reset(seed=SEED)
    ends = 0
    for actions in _actions():
        nxt, rewards, term, trunc, infos = vec.step(actions)
        buf.add(obs, actions, rewards, nxt, term, trunc, **({"infos": infos} if with_infos else {}))
        obs = nxt
        done = term | trunc
        ends += int(done.sum())
        if mode is AutoresetMode.DISABLED and done.any():
            obs, _ = vec.reset(options={"reset_mask": done})
    vec.close()
    episodes = _true_episodes(mode)
    assert ends >= 10 and any(tr[4] for ep in episodes for tr in ep) and any(tr[5] for ep in episodes for tr in ep)
    want = sorted(x for ep in episodes for x in reference(space, ep, n, False))
    assert held(buf, space) == want


@pytest.mark.parametrize("n", [1, 3])
def test_extend_of_a_recorded_next_step_rollout_stores_the_true_transitions(n):
    """The outputs of ``STEPS`` NEXT_STEP vector steps stacked to ``[T, E]`` and given to one ``extend``: the
    true episodes' transitions, as ``add`` of each step gives."""
    vec = _vector(AutoresetMode.NEXT_STEP)
    space = vec.single_observation_space
    obs, _ = vec.reset(seed=SEED)
    steps = []
    for actions in _actions():
        nxt, rewards, term, trunc, _ = vec.step(actions)
        steps.append((obs, actions, rewards, nxt, term, trunc))
        obs = nxt
    vec.close()
    buf = ReplayBuffer(space, vec.single_action_space, capacity=400 * ENVS, n_step=n, discount=G, num_envs=ENVS)
    buf.extend(*(np.stack([s[j] for s in steps]) for j in range(6)))
    want = sorted(x for ep in _true_episodes(AutoresetMode.NEXT_STEP) for x in reference(space, ep, n, False))
    assert held(buf, space) == want


def test_one_env_loops_of_an_autoreset_env_and_of_a_plain_env_store_the_true_transitions():
    """One env, unbatched: gymnasium's Autoreset wrapper (it resets on the call after an end, as NEXT_STEP
    does) with the obvious loop, and a plain env that the loop resets: each buffer holds its true episodes."""
    space = gym.make(ENV_ID).observation_space
    for wrapped, mode in ((True, AutoresetMode.NEXT_STEP), (False, AutoresetMode.SAME_STEP)):
        env = gym.make(ENV_ID, max_episode_steps=LIMIT)
        if wrapped:
            env = gym.wrappers.Autoreset(env)
        buf = ReplayBuffer(space, env.action_space, capacity=400, n_step=2, discount=G)
        obs, _ = env.reset(seed=SEED)
        for action in _actions()[:, 0]:
            nxt, reward, term, trunc, _ = env.step(int(action))
            buf.add(obs, int(action), reward, nxt, term, trunc)
            obs = nxt
            if (term or trunc) and not wrapped:
                obs, _ = env.reset()
        env.close()
        assert held(buf, space) == sorted(reference(space, _true_episodes(mode)[0], 2, False)), mode.name
