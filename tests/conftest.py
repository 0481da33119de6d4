"""Test settings: hypothesis runs derandomized, so every run draws the same examples; one local Ray instance
for the whole session (loopback only), started by the first test that asks for it."""

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("rlflow", derandomize=True, deadline=None, print_blob=True)
settings.load_profile("rlflow")


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance bound to 127.0.0.1, with a small object store and a temporary folder of its own;
    its workers import this folder's helper modules. Shut down at the end of the session (never
    ``ray stop``, which would end every Ray process of the machine)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    import ray

    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=200 * 2**20, _node_ip_address="127.0.0.1",
             _temp_dir=tempfile.mkdtemp(prefix="rlflow-ray-"), log_to_driver=False)
    yield ray
    ray.shutdown()
