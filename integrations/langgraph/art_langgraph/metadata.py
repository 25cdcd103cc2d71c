"""Per-call metadata from LangChain's run: the LangGraph node (and its path) that made a call.

LangGraph puts ``langgraph_node``, ``langgraph_step``, ``langgraph_path`` and
``langgraph_checkpoint_ns`` into the config metadata of every node it runs; LangChain hands
that metadata to the chat model's run manager. We forward it with the request, and the
gateway stores it on the recorded ``LLMCall.metadata``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# Keys that are internal bookkeeping (``__pregel_*``), LangSmith tracing fields (``ls_*``) or
# duplicates of a ``langgraph_*`` key, or package versions: not useful on a recorded call.
_DROPPED_PREFIXES = ("__", "ls_")
_DROPPED_KEYS = frozenset({"checkpoint_ns", "lc_versions"})


def node_path(checkpoint_ns: str) -> list[str]:
    """The node names of a checkpoint namespace, outermost first.

    Example:
        >>> node_path("research:1f0c|agent:9a2b")
        ['research', 'agent']
        >>> node_path("")
        []
    """
    return [part.partition(":")[0] for part in checkpoint_ns.split("|") if part]


def _json_value(value: Any) -> Any | None:
    """``value`` as plain JSON, or None when it does not serialize (it is then left out)."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return None


def call_metadata(run_metadata: Mapping[str, Any], run_id: object | None = None) -> dict[str, Any]:
    """The metadata to record with one call, from the LangChain run's metadata.

    Adds ``langgraph_node_path`` (the node names from the outermost graph to the node that
    made the call, e.g. ``["research", "agent"]`` inside a subgraph) and ``langchain_run_id``
    (to find the call in a LangSmith / tracer view).

    Example:
        >>> call_metadata({"langgraph_node": "agent", "langgraph_checkpoint_ns": "agent:1",
        ...                "__pregel_task_id": "1", "ls_provider": "openai"})
        {'langgraph_node': 'agent', 'langgraph_checkpoint_ns': 'agent:1', 'langgraph_node_path': ['agent']}
    """
    out: dict[str, Any] = {}
    for key, value in run_metadata.items():
        if key in _DROPPED_KEYS or key.startswith(_DROPPED_PREFIXES):
            continue
        plain = _json_value(value)
        if plain is not None:
            out[key] = plain
    namespace = out.get("langgraph_checkpoint_ns")
    if isinstance(namespace, str):
        out["langgraph_node_path"] = node_path(namespace)
    if run_id is not None:
        out["langchain_run_id"] = str(run_id)
    return out
