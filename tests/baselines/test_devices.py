"""The baselines' --device: the flag resolved and refused, the same CPU runs as before, learner files saved on a
GPU loading on a CPU machine; with a CUDA device, short runs that train there and whose saved learners evaluate."""

from __future__ import annotations

import dataclasses
from unittest import mock

import numpy as np
import pytest
import torch

from baselines import dqn, mappo, ppo, qmix, sac, selfplay_dqn, td3, to_device, torch_device
from rlflow.loggers import read_csv
from rlflow.loop.checkpoint import load_state, save_state

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
BASELINES = [dqn, ppo, sac, td3, mappo, qmix, selfplay_dqn]


def short_dqn(tmp_path, name, **options) -> dqn.Args:
    return dqn.Args(total_steps=400, learning_starts=100, samples_per_insert=8.0, batch_size=16, hidden=(16,),
                    eval_every=200, eval_episodes=2, logdir=str(tmp_path / name), progress=False, **options)


def cuda_args(module, tmp_path):
    """Short runs of each baseline (seconds), on the CUDA device."""
    options = {
        dqn: dict(total_steps=400, learning_starts=100, samples_per_insert=8.0, batch_size=16, hidden=(16,),
                  eval_every=400, eval_episodes=2),
        ppo: dict(total_steps=512, num_envs=4, n_steps=32, n_epochs=2, minibatch_size=64, eval_every=512,
                  eval_episodes=2),
        sac: dict(total_steps=300, learning_starts=100, samples_per_insert=32.0, batch_size=32, hidden=(16,),
                  eval_every=300, eval_episodes=1),
        td3: dict(total_steps=300, learning_starts=100, samples_per_insert=32.0, batch_size=32, hidden=(16,),
                  eval_every=300, eval_episodes=1),
        mappo: dict(total_steps=200, num_envs=2, n_steps=10, n_epochs=1, hidden=(8,), eval_every=200, eval_episodes=1,
                    max_cycles=10),
        qmix: dict(total_steps=400, num_envs=2, max_cycles=10, batch_size=4, learning_starts=4, samples_per_insert=4.0,
                   hidden=8, mixing_embed=4, hypernet_embed=8, eval_every=400, eval_episodes=1),
    }[module]
    return module.Args(device="cuda", logdir=str(tmp_path / "run"), progress=False, **options)


def test_the_device_flag_resolves_auto_and_names():
    assert dqn.Args().device == "auto"
    assert torch_device(dqn.Args(device="cpu")) == torch.device("cpu")
    assert torch_device(dqn.Args(device="auto")) == torch.device("cuda" if CUDA else "cpu")


@pytest.mark.skipif(CUDA, reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("module", BASELINES, ids=lambda m: m.__name__.split(".")[-1])
def test_cuda_without_a_cuda_device_is_refused_before_the_run_starts(tmp_path, module):
    args = module.Args(device="cuda", logdir=str(tmp_path / "run"), progress=False)
    with pytest.raises(ValueError, match=r"--device cuda: no CUDA device is available \(torch .*\); use --device "
                                         r"cpu or auto"):
        module.main(args)
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(CUDA, reason="checks the refusal on a machine without CUDA")
def test_a_numbered_cuda_device_without_cuda_is_refused():
    with pytest.raises(ValueError, match="--device cuda:1: no CUDA device is available"):
        torch_device(dqn.Args(device="cuda:1"))


@needs_cuda
def test_a_cuda_device_this_machine_lacks_is_refused():
    n = torch.cuda.device_count()
    assert torch_device(dqn.Args(device="cuda:0")) == torch.device("cuda:0")
    with pytest.raises(ValueError, match=f"--device cuda:{n}: this machine has {n} CUDA device"):
        torch_device(dqn.Args(device=f"cuda:{n}"))


@pytest.mark.parametrize(("name", "match"), [("gpu", "--device gpu: not a device"),
                                             ("cuda:x", "--device cuda:x: not a device"),
                                             ("mps", "--device mps: the baselines train on cpu or cuda"),
                                             ("meta", "--device meta: the baselines train on cpu or cuda")])
def test_an_unknown_device_is_refused(name, match):
    with pytest.raises(ValueError, match=match):
        torch_device(dqn.Args(device=name))


def test_cpu_arrays_become_tensors_without_a_copy():
    rows = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": (np.zeros(2, bool), None)}
    out = to_device(rows, torch.device("cpu"))
    assert out["a"].data_ptr() == rows["a"].ctypes.data and out["b"][0].dtype == torch.bool and out["b"][1] is None


def test_a_learner_on_the_cpu_hands_its_network_itself_to_policies_and_actor_processes():
    for num_actors in (0, 2):
        learner = dqn.DQNLearner(dqn.QNetwork(4, 2, (8,), False), dqn.Args(num_actors=num_actors, hidden=(8,)))
        assert learner.get_params() is learner.q  # one process: no copy; actors: Ray pickles it as it is


def test_a_learner_file_saved_on_a_gpu_loads_and_evaluates_on_the_cpu(tmp_path):
    """A learner.pt whose tensors were saved from a CUDA device: ``load_state`` maps them to the CPU where torch
    has no CUDA device (``torch.load(weights_only=True)`` alone refuses them there), and --evaluate runs it."""
    args = short_dqn(tmp_path, "run", device="cpu")
    dqn.main(args)
    saved = load_state(tmp_path / "run" / "learner.pt")
    with mock.patch("torch.serialization.location_tag", lambda storage: "cuda:0"):  # as torch.save tags CUDA
        save_state(tmp_path / "gpu.pt", saved)
    if not CUDA:
        with pytest.raises(RuntimeError, match="on a CUDA device"):
            torch.load(tmp_path / "gpu.pt", weights_only=True)
    loaded = load_state(tmp_path / "gpu.pt")
    q = loaded["learner"]["q"]
    assert all(torch.equal(q[k].cpu(), saved["learner"]["q"][k]) for k in q)
    assert all(t.device.type == ("cuda" if CUDA else "cpu") for t in q.values())
    again = dataclasses.replace(args, evaluate=str(tmp_path / "gpu.pt"), eval_episodes=2, seed=7)
    from_gpu = dqn.main(again)
    from_cpu = dqn.main(dataclasses.replace(again, evaluate=str(tmp_path / "run" / "learner.pt")))
    assert from_gpu.final_evaluation == from_cpu.final_evaluation


def trained(module, monkeypatch):
    """The learner and policy of ``module.main``'s run (spied on its ``train``)."""
    seen = {}
    real = module.train

    def spy(name, args, env, eval_env, policy, learner, *rest, **options):
        seen.update(policy=policy, learner=learner)
        return real(name, args, env, eval_env, policy, learner, *rest, **options)

    monkeypatch.setattr(module, "train", spy)
    return seen


def tensors_of(tree):
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in tensors_of(v)]
    if isinstance(tree, list | tuple):
        return [t for v in tree for t in tensors_of(v)]
    return []


@needs_cuda
@pytest.mark.parametrize("module", [dqn, ppo, sac, td3, mappo, qmix], ids=lambda m: m.__name__.split(".")[-1])
def test_a_cuda_run_trains_on_the_gpu_and_its_saved_learner_evaluates(tmp_path, monkeypatch, module):
    seen = trained(module, monkeypatch)
    args = cuda_args(module, tmp_path)
    result = module.main(args)
    assert result.learner_steps > 0 and result.evaluations
    floats = [t for t in tensors_of(seen["learner"].state_dict()) if t.is_floating_point()]  # networks, optimizers
    assert floats and all(t.is_cuda for t in floats)
    saved = load_state(tmp_path / "run" / "learner.pt")  # CUDA tensors, loaded where they were saved
    assert any(t.is_cuda for t in tensors_of(saved["learner"]))
    for device in ("cuda", "cpu"):  # the saved learner evaluates on the GPU and on the CPU
        again = dataclasses.replace(args, device=device, evaluate=str(tmp_path / "run" / "learner.pt"),
                                    eval_episodes=2, seed=7, logdir=str(tmp_path / f"eval-{device}"))
        evaluated = module.main(again)
        assert evaluated.learner_steps == 0 and np.isfinite(evaluated.final_evaluation)


@needs_cuda
@pytest.mark.parametrize("options", [dict(lstm=8), dict(env_id="Pendulum-v1", num_envs=2, n_steps=64)])
def test_ppo_with_an_lstm_or_box_actions_trains_on_the_gpu(tmp_path, monkeypatch, options):
    seen = trained(ppo, monkeypatch)
    args = dataclasses.replace(cuda_args(ppo, tmp_path), **options)
    assert ppo.main(args).learner_steps > 0
    assert all(p.is_cuda for p in seen["learner"].net.parameters())


@needs_cuda
def test_recurrent_mappo_trains_on_the_gpu(tmp_path, monkeypatch):
    seen = trained(mappo, monkeypatch)
    args = dataclasses.replace(cuda_args(mappo, tmp_path), recurrent=True, chunk_length=5)
    assert mappo.main(args).learner_steps > 0
    assert all(p.is_cuda for p in seen["learner"].net.parameters())


@needs_cuda
def test_selfplay_dqn_trains_on_the_gpu_and_its_saved_network_evaluates(tmp_path):
    args = selfplay_dqn.Args(device="cuda", total_turns=400, num_envs=2, learning_starts=100, batch_size=16,
                             hidden=(16,), eval_every=400, eval_games=4, logdir=str(tmp_path / "run"), progress=False)
    selfplay_dqn.main(args)
    assert all(t.is_cuda for t in load_state(tmp_path / "run" / "q.pt")["q"].values())
    for device in ("cuda", "cpu"):
        score = selfplay_dqn.main(dataclasses.replace(args, device=device, evaluate=str(tmp_path / "run")))
        assert score["win"] + score["draw"] + score["loss"] == pytest.approx(1.0)


@needs_cuda
def test_a_cuda_learner_hands_policies_its_network_and_actor_processes_a_cpu_copy():
    """In one process the policy acts with the learner's network itself, on the GPU (observations there, actions
    back as numpy); with actor processes get_params() is a copy on the CPU (what Ray pickles to them), made at
    each call, with the network's values, and the actor's policy acts with it."""
    q = dqn.QNetwork(4, 2, (8,), False).to("cuda")
    one = dqn.DQNLearner(q, dqn.Args(num_actors=0, hidden=(8,)))
    assert one.get_params() is q
    policy = dqn.exploration(torch.nn.Linear(1, 1), 2, dqn.Args())
    policy.set_params(one.get_params())
    actions, _, _ = policy.act(np.zeros((3, 4), np.float32), None, evaluation=True)
    assert isinstance(actions, np.ndarray) and actions.shape == (3,)

    shipped = dqn.DQNLearner(q, dqn.Args(num_actors=2, hidden=(8,))).get_params()
    assert shipped is not q and all(t.device.type == "cpu" for t in shipped.state_dict().values())
    assert all(torch.equal(a, b.cpu()) for a, b in zip(shipped.state_dict().values(), q.state_dict().values(),
                                                        strict=True))
    actor_policy = dqn.exploration(dqn.QNetwork(4, 2, (8,), False), 2, dqn.Args(num_actors=2), actor=0)
    actor_policy.set_params(shipped)
    assert actor_policy.act(np.zeros((3, 4), np.float32), None, evaluation=True)[0].shape == (3,)
    obs = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(shipped(obs), q(obs.cuda()).cpu())

    low, high = np.float32([-2.0]), np.float32([2.0])
    critics = (sac.Critic(3, 1, (8,)).cuda(), sac.Critic(3, 1, (8,)).cuda())
    ppo_learner = ppo.PPOLearner(ppo.ActorCritic(4, 2, (8,)).cuda(), ppo.Args(num_actors=2, hidden=(8,)))
    sac_learner = sac.SACLearner(sac.GaussianActor(3, low, high, (8,)).cuda(), critics, sac.Args(num_actors=2))
    td3_learner = td3.TD3Learner(td3.Actor(3, low, high, (8,)).cuda(), critics, td3.Args(num_actors=2))
    for net in (ppo_learner.get_params()["net"], sac_learner.get_params(), td3_learner.get_params()):
        assert all(t.device.type == "cpu" for t in net.state_dict().values())


@needs_cuda
@pytest.mark.timeout(300)
def test_dqn_on_the_gpu_with_actor_processes_ships_them_cpu_parameters(ray_local, tmp_path):
    """Actor processes (Ray gives them no GPU) act with CPU copies of the learner's network on the GPU."""
    args = dqn.Args(device="cuda", total_steps=1_500, learning_starts=200, samples_per_insert=8.0, batch_size=32,
                    hidden=(16,), eval_every=1_500, eval_episodes=2, logdir=str(tmp_path), progress=False, num_actors=2,
                    sync_period=100)
    result = dqn.main(args)
    assert result.env_steps >= 1_500 and result.learner_steps > 0 and result.evaluations
    assert {float(r["actor"]) for r in read_csv(tmp_path / "train.csv")} == {0.0, 1.0}
