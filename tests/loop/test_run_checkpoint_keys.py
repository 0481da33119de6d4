"""A run checkpoint's ``run.pt`` of the right format and version but missing a key ``rlflow.run`` reads, or
holding one of another type or shape, raises ``CheckpointError`` naming the key before the store, the table,
the learner, the policy or torch's RNG change.
"""

import shutil

import numpy as np
import pytest
import torch
from checkpointed_parts import SeededPolicy, assert_same

import rlflow
from rlflow import adders, envs
from rlflow.loop import checkpoint as run_checkpoint
from rlflow.replay import CheckpointError, SampleToInsertRatio, StepStore, Table, Uniform

LANES = 2


class CountingLearner(rlflow.Learner):
    def __init__(self) -> None:
        self.steps = 0

    def step(self, sample):
        self.steps += 1
        return {"steps": float(self.steps)}

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]


def run_parts(seed):
    env = envs.make("CartPole-v1", num_envs=LANES, max_episode_steps=20)
    store = StepStore(env.spec, capacity=100, lanes=LANES)
    table = Table(store, sampler=Uniform(seed=0), rate_limiter=SampleToInsertRatio(1.0, 8, error_buffer=16))
    return env, table, adders.NStepTransition(store, [table], n=2, discount=0.9), CountingLearner(), SeededPolicy(seed)


def run(parts, checkpoint_dir, *, resume):
    env, table, adder, learner, policy = parts
    return rlflow.run(env, policy, learner, adder, table, steps=60, batch_size=4, seed=3, progress=False,
                      checkpoint_every=30, checkpoint_dir=checkpoint_dir, resume=resume)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    result = run(run_parts(1), root, resume=False)
    assert result.env_steps == 60 and result.episodes and result.learner_steps
    state = torch.load(run_checkpoint.latest(root) / "run.pt", weights_only=True)
    assert state["env"] is not None and state["variable_client"] is not None
    return root


def _without(key):
    return lambda s: {k: v for k, v in s.items() if k != key}


def _set(key, value):
    return lambda s: {**s, key: value}


def _stats(returns):
    return lambda s: {**s, "episode_stats": {**s["episode_stats"], "returns": returns}}


MISSING = ["env_steps", "learner_steps", "episodes", "evaluations", "learner_metrics", "counters", "adder",
           "learner", "policy", "env", "timestep", "episode_stats", "actor", "variable_client"]
WRONG = {
    "env_steps": "60", "learner_steps": -1, "episodes": [(1.0, 2)], "evaluations": {"a": 1},
    "learner_metrics": {"loss": "high"}, "counters": {"next_log": 10}, "adder": [1, 2], "learner": None,
    "policy": [], "env": 7, "timestep": [1], "actor": {}, "variable_client": {"last_pull": "30"}, "learning": "yes",
}


@pytest.mark.parametrize(("edit", "key"), [
    pytest.param(_set("actor", {"state": [np.zeros(LANES)]}), "actor", id="actor-state-of-another-policy"),
    *(pytest.param(_without(k), k, id=f"no-{k}") for k in MISSING),
    *(pytest.param(_set(k, v), k, id=f"wrong-{k}") for k, v in WRONG.items()),
    pytest.param(_stats(np.zeros(LANES + 1)), "episode_stats", id="episode-stats-of-other-lanes"),
    pytest.param(_stats([0.0, 0.0]), "episode_stats", id="episode-stats-a-list"),
    pytest.param(_set("evaluations", [(100, 9.5)]), "evaluations", id="evaluations-without-their-std"),
])
def test_a_run_file_missing_a_key_or_of_another_type_is_refused_before_anything_changes(saved, tmp_path, edit, key):
    shutil.copytree(saved, tmp_path, dirs_exist_ok=True)
    path = run_checkpoint.latest(tmp_path) / "run.pt"
    state = run_checkpoint.load_state(path)  # numpy values decoded, so the edits put plain numpy in
    run_checkpoint.save_state(path, {**edit(state), "torch_rng": state["torch_rng"]})
    parts = run_parts(2)
    _, table, adder, learner, policy = parts
    torch.manual_seed(9)
    before = (table.state_dict(), table.store.state_dict(), adder.state_dict(), policy.state_dict(),
              torch.get_rng_state())
    with pytest.raises(CheckpointError, match=f"key '{key}': expected|{key} state: recurrent state"):
        run(parts, tmp_path, resume=True)
    after = (table.state_dict(), table.store.state_dict(), adder.state_dict(), policy.state_dict(),
             torch.get_rng_state())
    assert_same(after, before)
    assert learner.steps == 0 and table.size == 0 and int(table.store.count.sum()) == 0


def test_a_checkpoint_without_the_learners_turn_resumes(saved, tmp_path):
    """``learning`` (the turn of a run with bursts) came after the other keys: a checkpoint without it resumes
    with the actors' turn."""
    shutil.copytree(saved, tmp_path, dirs_exist_ok=True)
    path = run_checkpoint.latest(tmp_path) / "run.pt"
    state = run_checkpoint.load_state(path)
    assert state["learning"] is False  # a run without bursts never hands the learner the turn
    run_checkpoint.save_state(path, _without("learning")(state))
    env, table, adder, learner, policy = run_parts(2)
    result = rlflow.run(env, policy, learner, adder, table, steps=90, batch_size=4, seed=3, progress=False,
                        checkpoint_dir=tmp_path, resume=True)
    assert result.env_steps == 90 and learner.steps > 0


def test_the_unedited_checkpoint_resumes(saved, tmp_path):
    shutil.copytree(saved, tmp_path, dirs_exist_ok=True)
    path = run_checkpoint.latest(tmp_path) / "run.pt"
    state = run_checkpoint.load_state(path)
    run_checkpoint.save_state(path, state)  # the same round trip as the edited files take
    parts = run_parts(2)
    assert run(parts, tmp_path, resume=True).env_steps == 60 and parts[3].steps > 0

