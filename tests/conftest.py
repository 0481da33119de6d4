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
def ray_cluster():
    """A local Ray cluster's head node bound to 127.0.0.1 (``ray.cluster_utils.Cluster``, so a test can add and
    remove nodes), with a small object store and a temporary folder of its own; the session's Ray connects
    to it. Its workers import this folder's helper and test modules and the examples' modules. Shut down at the end of
    the session (never ``ray stop``, which would end every Ray process of the machine)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    here = Path(__file__).resolve().parent
    # the helper modules here, the test modules in the folders (laid out as the package), and the extension
    # examples' classes, as a user's own module
    tests = sorted(p for p in here.iterdir() if p.is_dir() and p.name[0] not in "._")
    folders = [here, *tests, here.parent / "examples"]
    os.environ["PYTHONPATH"] = os.pathsep.join([*map(str, folders), *filter(None, [os.environ.get("PYTHONPATH")])])
    import ray
    from ray.cluster_utils import Cluster

    # Ray's default temp root is this session's own folder too: the cluster writes its address file there
    # (not in /tmp/ray, which a fresh machine lacks and where another program's ray.init() would find it).
    root = tempfile.mkdtemp(prefix="rlflow-ray-")
    os.environ["RAY_TMPDIR"] = root
    os.makedirs(os.path.join(root, "ray"))
    import torch

    cluster = Cluster(initialize_head=True, head_node_args=dict(  # (a Cluster's nodes get no GPU unless told)
        num_cpus=4, num_gpus=torch.cuda.device_count(), object_store_memory=200 * 2**20,
        node_ip_address="127.0.0.1", include_dashboard=False, temp_dir=os.path.join(root, "ray")))
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="session")
def ray_local(ray_cluster):
    """The session's Ray (connected to :func:`ray_cluster`'s head), as the ``ray`` module."""
    import ray

    return ray
