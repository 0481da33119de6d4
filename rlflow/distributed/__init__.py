"""rlflow on several processes and machines: actors, a replay server and a learner, laid out on Ray.

``pip install "rlflow[ray]"``. Importing this package does not import Ray; :func:`run` and :func:`init_local`
do. A local run listens on 127.0.0.1 only. See ``docs/distributed.md``.
"""

from rlflow.distributed.launcher import Layout, run
from rlflow.distributed.local_ray import init_local

__all__ = ["Layout", "init_local", "run"]
