"""art_openai_agents: train OpenAI Agents SDK agents with art-core, agents unchanged.

``ArtModelProvider(model)`` serves every agent of a run from a trainable model through the
current rollout's base URL; ``rollout(model, agent, input)`` (or ``@wrap_rollout(model)``)
runs the agent under a fresh rollout and returns its token-exact trajectory, every call
tagged with its agent's name.

Example:
    >>> import art_openai_agents
    >>> trajectory = await art_openai_agents.rollout(model, agent, "Weather in Paris?")  # needs a registered model: `model`, an `agent`  # doctest: +SKIP
"""

from art_openai_agents.call_metadata import call_metadata
from art_openai_agents.capture import METADATA_KEY, AgentsRun, capture
from art_openai_agents.filtering import AgentFilter
from art_openai_agents.model import METADATA_HEADER, ArtModel
from art_openai_agents.provider import ArtModelProvider
from art_openai_agents.rollout import rollout, run_config, wrap_rollout
from art_openai_agents.spans import SpanLog, SpanRecord
from art_openai_agents.tracing import (
    ArtTracingProcessor,
    configure_tracing,
    tracing_installed,
    tracing_processor,
)

__all__ = [
    "METADATA_HEADER",
    "METADATA_KEY",
    "AgentFilter",
    "AgentsRun",
    "ArtModel",
    "ArtModelProvider",
    "ArtTracingProcessor",
    "SpanLog",
    "SpanRecord",
    "call_metadata",
    "capture",
    "configure_tracing",
    "rollout",
    "run_config",
    "tracing_installed",
    "tracing_processor",
    "wrap_rollout",
]
