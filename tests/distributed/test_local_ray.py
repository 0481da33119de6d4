"""What a distributed run's Ray listens on: a local run (``address=None``) starts its own Ray instance with
every listener on loopback, whatever the user imported first; a cluster address or ``RAY_ADDRESS`` joins
that cluster; a Ray the user started is used as it is."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from rlflow.distributed.local_ray import connect, init_local

HERE = Path(__file__).resolve().parent


def is_loopback(address: str) -> bool:
    """127.0.0.0/8 and ::1, also written as an IPv4-mapped IPv6 address (``::ffff:127.0.0.1``, how a socket
    bound to 127.0.0.1 on a dual-stack listener is reported)."""
    ip = ipaddress.ip_address(address.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def test_is_loopback_tells_loopback_from_every_other_address():
    assert [is_loopback(a) for a in ("127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1")] == [True] * 4
    assert [is_loopback(a) for a in ("0.0.0.0", "::", "192.0.2.2", "10.0.0.1", "::ffff:192.0.2.2", "fe80::1")] \
        == [False] * 6


@pytest.mark.parametrize("start", ["run", "init_local"])
def test_a_local_run_listens_on_loopback_only(tmp_path, start):
    """The docs' worked example in a fresh process with none of Ray's variables set and Ray imported before
    rlflow: every socket that any process of the run listens on (the driver, Ray's GCS, raylet, object manager,
    agents and workers) is bound to a loopback address. A Ray the run started is shut down at its end; one the
    program started with ``init_local`` (its options applied) is left running. Ray's switch between loopback and
    the machine's address is as the program had it."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    environment["PYTHONPATH"] = str(HERE)
    command = [sys.executable, str(HERE / "listening_run.py"), *(["init_local"] if start == "init_local" else [])]
    out = subprocess.run(command, env=environment, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["learner_steps"] >= 20
    names = {name for name, _, _ in seen["listening"]}
    assert {"gcs_server", "raylet"} <= names, seen["listening"]  # the listing saw the run's Ray processes
    exposed = [row for row in seen["listening"] if not is_loopback(row[1])]
    assert exposed == [], f"listening beyond loopback: {exposed} (all: {seen['listening']})"
    assert seen["ray_still_initialized"] is (start == "init_local")
    assert seen["cpus"] == (4 if start == "init_local" else None)
    assert seen["switch"] == [None, True]  # as the user's program had them: a later ray.init is Ray's own


# --------------------------------------------------------------------------- which Ray a run connects to
class FakeRay(types.ModuleType):
    """Records ``ray.init``'s keywords and the value of Ray's switch while it ran; its node lands on ``node``."""

    def __init__(self, node: str = "127.0.0.1", initialized: bool = False, fails: bool = False) -> None:
        super().__init__("ray")
        self.node, self.initialized, self.fails = node, initialized, fails
        self.inits: list[tuple[dict, object]] = []
        self.shutdowns = 0
        self.constants = types.ModuleType("ray._private.ray_constants")
        self.constants.ENABLE_RAY_CLUSTER = True
        self.util = types.SimpleNamespace(get_node_ip_address=lambda: self.node)
        self.__version__ = "fake"

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **options) -> None:
        self.inits.append((options, self.constants.ENABLE_RAY_CLUSTER))
        if self.fails:
            raise ConnectionError("no node")
        self.initialized = True

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.initialized = False


@pytest.fixture
def fake_ray(monkeypatch):
    def install(**kw) -> FakeRay:
        fake = FakeRay(**kw)
        monkeypatch.setitem(sys.modules, "ray", fake)
        monkeypatch.setitem(sys.modules, "ray._private.ray_constants", fake.constants)
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        return fake

    return install


def test_connect_starts_a_loopback_instance_joins_a_named_cluster_or_keeps_the_one_started(fake_ray, monkeypatch):
    fake = fake_ray()
    assert connect(None) is True
    assert fake.inits == [(dict(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
                                log_to_driver=True), False)]  # Ray's switch off while it started
    assert fake.constants.ENABLE_RAY_CLUSTER is True  # and back on after

    for address in ("auto", "10.1.2.3:6379"):
        fake = fake_ray()
        assert connect(address) is True
        assert fake.inits == [(dict(address=address, log_to_driver=True), True)]

    fake = fake_ray()
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")  # as `ray job submit` runs a driver: Ray's own choice
    assert connect(None) is True
    assert fake.inits == [(dict(address=None, log_to_driver=True), True)]

    fake = fake_ray(initialized=True)
    assert connect(None) is False and connect("auto") is False
    assert fake.inits == []


def test_a_local_node_off_loopback_is_shut_down_and_named(fake_ray):
    fake = fake_ray(node="192.0.2.2")
    with pytest.raises(RuntimeError, match=r"on 192\.0\.2\.2, not on 127\.0\.0\.1.*RAY_ENABLE_[A-Z_]*=0"):
        connect(None)
    assert fake.shutdowns == 1 and not fake.initialized


def test_ray_s_switch_comes_back_when_the_start_fails(fake_ray):
    fake = fake_ray(fails=True)
    with pytest.raises(ConnectionError):
        init_local()
    assert fake.inits[0][1] is False and fake.constants.ENABLE_RAY_CLUSTER is True


def test_init_local_refuses_what_would_not_be_a_local_loopback_start(fake_ray):
    fake = fake_ray()
    with pytest.raises(TypeError, match=r"no \['address'\].*ray.init\(address=...\)"):
        init_local(address="auto")
    with pytest.raises(TypeError, match=r"_node_ip_address"):
        init_local(_node_ip_address="0.0.0.0")
    fake.initialized = True
    with pytest.raises(RuntimeError, match="already started"):
        init_local(num_cpus=2)
    assert fake.inits == []
    fake.initialized = False
    init_local(num_cpus=2, include_dashboard=True)
    assert fake.inits == [(dict(address="local", _node_ip_address="127.0.0.1", include_dashboard=True, num_cpus=2),
                           False)]
