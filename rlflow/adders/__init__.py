"""Adders: turn a batched TimeStep stream into stored rows and table items.

All adders share one boundary model (:mod:`rlflow.adders.base`): each observation is stored once, as a
row of its lane; an episode's final observation is a row of its own; items are windows of rows.
"""

from rlflow.adders.base import Adder, StepEvents
from rlflow.adders.block import StepBlock
from rlflow.adders.episode import Episode
from rlflow.adders.multiagent import MultiAgentTransition, flatten_agents, split_agents, split_groups, squeeze_agents
from rlflow.adders.sequence import EndBehavior, Sequence
from rlflow.adders.transition import NStepTransition

__all__ = [
    "Adder",
    "EndBehavior",
    "Episode",
    "MultiAgentTransition",
    "NStepTransition",
    "Sequence",
    "StepBlock",
    "StepEvents",
    "flatten_agents",
    "split_agents",
    "split_groups",
    "squeeze_agents",
]
