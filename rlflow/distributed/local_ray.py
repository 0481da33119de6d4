"""The Ray a distributed run uses: a local instance that listens on loopback only, or the cluster the user named.

Ray, started by a plain ``ray.init()`` on Linux, binds its listeners (the GCS, the raylet's node and object
managers, every worker's and agent's RPC server) to the machine's network address or to every interface: it
replaces a node address of ``127.0.0.1`` with the machine's reachable one unless Ray's switch for that,
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, was set before Ray was imported. A local run needs no listener
beyond this machine, so :func:`init_local` turns that switch off for the moment it starts Ray, whatever the
program imported first, and checks where the node ended up before anything runs on it.
"""

from __future__ import annotations

import importlib
import ipaddress
import os
from typing import Any

__all__ = ["LOOPBACK", "connect", "import_ray", "init_local"]

LOOPBACK = "127.0.0.1"


def import_ray() -> Any:
    """The ``ray`` module, or an ImportError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise ImportError("rlflow.distributed needs Ray: pip install \"rlflow[ray]\"") from None
    return ray


def init_local(**options: Any) -> None:
    """Start a Ray instance on this machine with every listener bound to 127.0.0.1.

    It is what :func:`rlflow.distributed.run` does with ``address=None``; call it instead of ``ray.init`` to
    start your own local instance (with your options) that runs then use as it is.

    Args:
        **options: keywords of ``ray.init`` (e.g. ``num_cpus``, ``object_store_memory``, ``log_to_driver``);
            ``include_dashboard`` defaults to False. Not ``address`` (this starts a new local instance: join a
            cluster with ``ray.init(address=...)``) nor ``_node_ip_address`` (it is 127.0.0.1).

    Raises:
        TypeError: ``address`` or ``_node_ip_address`` among the options.
        RuntimeError: Ray is already started in this process, or the node Ray started is not on loopback
            (it is shut down again before this raises).
    """
    refused = sorted({"address", "_node_ip_address"} & options.keys())
    if refused:
        raise TypeError(f"init_local starts a new Ray instance on {LOOPBACK}: it takes no {refused} (to join a "
                        "running cluster, call ray.init(address=...) or pass address= to distributed.run)")
    ray = import_ray()
    if ray.is_initialized():
        raise RuntimeError("Ray is already started in this process: a run uses it as it is (call init_local "
                           "instead of ray.init, or ray.shutdown() first)")
    # Ray reads its switch once, when it is imported, into this module-level flag; its node start asks the flag
    # whether to replace 127.0.0.1 with the machine's address. The flag is put back once the node is up.
    constants: Any = importlib.import_module("ray._private.ray_constants")
    replaces = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(address="local", _node_ip_address=LOOPBACK, **{"include_dashboard": False, **options})
    finally:
        constants.ENABLE_RAY_CLUSTER = replaces
    node = ray.util.get_node_ip_address()
    if not ipaddress.ip_address(node).is_loopback:
        ray.shutdown()
        raise RuntimeError(f"Ray {ray.__version__} started its local node on {node}, not on {LOOPBACK}, so its "
                           "ports would be open to the network: set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in the "
                           "environment before Python starts (then a local run listens on loopback only)")


def connect(address: str | None) -> bool:
    """Make sure this process is connected to the Ray a run uses; True where this call started or joined it
    (the run then shuts it down at its end), False where the process was already connected.

    - Already connected (the program called ``ray.init`` or :func:`init_local`): that Ray, as it is.
    - ``address`` given (``"auto"`` or ``"HOST:PORT"``): joins that cluster.
    - ``address`` None and ``RAY_ADDRESS`` set (as ``ray job submit`` sets it): joins that cluster, as
      ``ray.init()`` does.
    - Otherwise: a new local instance from :func:`init_local`, on loopback only (never a cluster that
      ``ray start`` left running on this machine: pass ``address="auto"`` for that one).
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    if address is None and not os.environ.get("RAY_ADDRESS"):
        init_local(log_to_driver=True)
    else:
        ray.init(address=address, log_to_driver=True)
    return True
