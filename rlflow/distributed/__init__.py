"""rlflow on several processes and machines: actors, a replay server and a learner, laid out on Ray.

``pip install "rlflow[ray]"``. Importing this package does not import Ray; :func:`run` does. See
``docs/distributed.md``.
"""

from rlflow.distributed.launcher import Layout, run

__all__ = ["Layout", "run"]
