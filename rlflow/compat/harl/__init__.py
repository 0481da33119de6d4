"""HARL's replay and rollout buffers (``harl.common.buffers``) on rlflow's pieces, for heterogeneous agents.

A HARL user switches by changing imports::

    # from harl.common.buffers.off_policy_buffer_ep import OffPolicyBufferEP
    # from harl.common.buffers.on_policy_actor_buffer import OnPolicyActorBuffer
    from rlflow.compat.harl import OffPolicyBufferEP, OnPolicyActorBuffer

- off-policy (:mod:`rlflow.compat.harl.off_policy`): :class:`OffPolicyBufferEP`, :class:`OffPolicyBufferFP`,
  HARL's ``insert``/``sample`` on a multi-agent :class:`~rlflow.ReplayBuffer` (each observation stored
  once, rlflow's n-step windows);
- on-policy (:mod:`rlflow.compat.harl.on_policy`): :class:`OnPolicyActorBuffer` (one per agent, each with
  its own spaces), :class:`OnPolicyCriticBufferEP`, :class:`OnPolicyCriticBufferFP`: HARL's arrays,
  ``insert``, ``after_update`` and ``compute_returns`` (on :func:`rlflow.returns.gae`), and its
  feed-forward, naive recurrent and chunked recurrent generators (on :mod:`rlflow.minibatches`).

``docs/harl.md`` lists what differs from HARL.
"""

from rlflow.compat.harl.off_policy import OffPolicyBufferEP, OffPolicyBufferFP
from rlflow.compat.harl.on_policy import OnPolicyActorBuffer, OnPolicyCriticBufferEP, OnPolicyCriticBufferFP

__all__ = ["OffPolicyBufferEP", "OffPolicyBufferFP", "OnPolicyActorBuffer", "OnPolicyCriticBufferEP",
           "OnPolicyCriticBufferFP"]
