"""art_langgraph: train LangGraph agents with art-core.

``init_chat_model()`` gives a LangChain chat model whose calls land in the current rollout;
``wrap_rollout(model, fn)`` runs a rollout function under a fresh rollout and returns its
``art.Trajectory`` with every LLM call the graph made, tagged with the node that made it.

Example:
    >>> import art_langgraph
    >>> llm = art_langgraph.init_chat_model(temperature=1.0)
    >>> # agent = create_react_agent(llm, tools); rollout = art_langgraph.wrap_rollout(model, fn)
"""

from art_langgraph.chat_model import ArtChatModel, init_chat_model
from art_langgraph.metadata import call_metadata
from art_langgraph.rollout import trajectory_from, wrap_rollout

__all__ = ["ArtChatModel", "call_metadata", "init_chat_model", "trajectory_from", "wrap_rollout"]
