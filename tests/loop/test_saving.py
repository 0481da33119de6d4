"""rlflow.save / rlflow.load: any object's state_dict, by name, without pickled code; bad input changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlflow
from rlflow.loop.checkpoint import save_state
from rlflow.replay import CheckpointError


class Learner(rlflow.Learner):
    """A learner whose state mixes a module, an optimizer, numpy values and plain values."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=1e-2)
        self.counts = np.arange(4, dtype=np.int16) * seed
        self.scale = np.float32(seed)
        self.name = f"learner-{seed}"

    def step(self, sample):
        loss = self.net(torch.ones(1, 3)).sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item()}

    def get_params(self):
        return self.net

    def state_dict(self):
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(), "counts": self.counts,
                "scale": self.scale, "meta": {"name": self.name, "sizes": (3, 8, 2), "none": None}}

    def load_state_dict(self, state):
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.counts, self.scale, self.name = state["counts"], state["scale"], state["meta"]["name"]


class Policy(rlflow.Policy):
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.steps = 0

    def act(self, observation, state, *, evaluation=False):
        return self.rng.integers(0, 2, len(observation)), None, state

    def state_dict(self):
        return {"rng": self.rng.bit_generator.state, "steps": self.steps}

    def load_state_dict(self, state):
        self.rng.bit_generator.state = state["rng"]
        self.steps = state["steps"]


def trained() -> tuple[Learner, Policy]:
    learner, policy = Learner(3), Policy(3)
    for _ in range(3):
        learner.step(None)
    policy.act(np.zeros((5, 1)), None)
    policy.steps = 7
    return learner, policy


def same_learner(a: Learner, b: Learner) -> None:
    for (ka, va), (kb, vb) in zip(a.net.state_dict().items(), b.net.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)
    assert a.optimizer.state_dict()["state"].keys() == b.optimizer.state_dict()["state"].keys()
    for k, s in a.optimizer.state_dict()["state"].items():
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(s[name], b.optimizer.state_dict()["state"][k][name])
    assert a.counts.dtype == b.counts.dtype and np.array_equal(a.counts, b.counts)
    assert type(b.scale) is np.float32 and a.scale == b.scale and a.name == b.name


def test_round_trip_restores_every_part_and_what_it_does_next(tmp_path):
    learner, policy = trained()
    path = rlflow.save(tmp_path / "runs" / "a" / "agent.pt", learner=learner, policy=policy)  # folders made
    assert path == tmp_path / "runs" / "a" / "agent.pt"
    new_learner, new_policy = Learner(9), Policy(9)
    rlflow.load(path, learner=new_learner, policy=new_policy)
    same_learner(learner, new_learner)
    assert new_policy.steps == 7
    obs = np.zeros((16, 1))
    assert np.array_equal(policy.act(obs, None)[0], new_policy.act(obs, None)[0])  # the same RNG stream
    assert learner.step(None) == new_learner.step(None)  # the optimizer's moments came back too


def test_any_subset_of_the_saved_parts_loads(tmp_path):
    learner, policy = trained()
    rlflow.save(tmp_path / "agent.pt", learner=learner, policy=policy, net=learner.net)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    rlflow.load(tmp_path / "agent.pt", net=net)
    assert torch.equal(net(torch.ones(2, 3)), learner.net(torch.ones(2, 3)))


def test_a_missing_part_raises_naming_the_saved_ones_and_changes_nothing(tmp_path):
    learner, _ = trained()
    rlflow.save(tmp_path / "agent.pt", learner=learner)
    fresh, other = Learner(5), Policy(5)
    with pytest.raises(CheckpointError, match=r"no part named \['policy'\]; the file holds \['learner'\]"):
        rlflow.load(tmp_path / "agent.pt", learner=fresh, policy=other)
    same_learner(fresh, Learner(5))


def test_a_part_that_refuses_its_state_is_put_back_with_the_parts_before_it(tmp_path):
    rlflow.save(tmp_path / "agent.pt", learner=Learner(3), policy=Learner(3))
    learner = Learner(5)
    wrong = Learner(5)
    wrong.net = torch.nn.Sequential(torch.nn.Linear(3, 4))  # a different network: its load raises
    wrong.optimizer = torch.optim.Adam(wrong.net.parameters())
    with pytest.raises(ValueError, match=r"(?s)part 'policy' does not take the saved state .*every part is as it was"):
        rlflow.load(tmp_path / "agent.pt", learner=learner, policy=wrong)
    same_learner(learner, Learner(5))  # loaded first, then put back


def test_saving_a_value_that_is_not_state_writes_nothing(tmp_path):
    path = tmp_path / "agent.pt"
    learner, policy = trained()
    rlflow.save(path, learner=learner)
    before = path.read_bytes()
    policy.state_dict = lambda: {"rng": policy.rng}  # a Generator object: code, not state
    with pytest.raises(TypeError, match=r"part 'policy'\['rng'\] is a Generator; a state holds tensors"):
        rlflow.save(path, learner=learner, policy=policy)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["agent.pt"]
    with pytest.raises(TypeError, match=r"part 'policy' is a list, which has no state_dict\(\)"):
        rlflow.save(path, policy=[1, 2])
    with pytest.raises(ValueError, match="name at least one part"):
        rlflow.save(path)
    with pytest.raises(ValueError, match="name the parts to load"):
        rlflow.load(path)
    with pytest.raises(CheckpointError, match=r"cannot be read as a saved state: FileNotFoundError"):
        rlflow.load(tmp_path / "missing.pt", learner=learner)


def test_files_not_written_by_save_are_refused(tmp_path):
    other = tmp_path / "other.pt"
    save_state(other, {"learner": {"w": torch.zeros(2)}})
    with pytest.raises(CheckpointError, match=r"not a file of rlflow\.save"):
        rlflow.load(other, learner=Learner(1))
    pickled = tmp_path / "pickled.pt"
    torch.save({"format": "rlflow.parts", "version": 1, "parts": {"learner": Learner(1)}}, pickled)
    with pytest.raises(CheckpointError):  # an object's pickle: refused, its code never runs
        rlflow.load(pickled, learner=Learner(1))
    truncated = tmp_path / "truncated.pt"
    rlflow.save(truncated, learner=Learner(1))
    truncated.write_bytes(truncated.read_bytes()[:-40])
    with pytest.raises(CheckpointError):
        rlflow.load(truncated, learner=Learner(2))
