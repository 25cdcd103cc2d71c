"""The agent being trained: a LangGraph tool agent that answers weather and time questions.

A hand-built ``StateGraph``: the ``agent`` node calls the chat model, a conditional edge sends
tool calls to the ``tools`` node (LangGraph's ``ToolNode``) and back, or ends. Nothing in here
knows about training except that the chat model comes from ``art_langgraph.init_chat_model``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

City = Literal["Paris", "Tokyo", "Lima", "Oslo"]
CITIES: tuple[str, ...] = ("Paris", "Tokyo", "Lima", "Oslo")
WEATHER = {"Paris": "rainy, 14C", "Tokyo": "sunny, 22C", "Lima": "cloudy, 19C", "Oslo": "snow, -3C"}
LOCAL_TIME = {"Paris": "09:00", "Tokyo": "16:00", "Lima": "02:00", "Oslo": "09:00"}

SYSTEM_PROMPT = (
    "You answer questions about the weather and the local time in a city. "
    "Call get_weather or get_time with the city, then answer in one short sentence."
)


@tool
def get_weather(city: City) -> str:
    """The current weather in a city."""
    return f"The weather in {city} is {WEATHER[city]}."


@tool
def get_time(city: City) -> str:
    """The current local time in a city."""
    return f"The local time in {city} is {LOCAL_TIME[city]}."


TOOLS = [get_weather, get_time]


@dataclass(frozen=True)
class Scenario:
    """One question and what a correct answer needs."""

    question: str
    tool: str
    city: str

    @property
    def fact(self) -> str:
        return WEATHER[self.city] if self.tool == "get_weather" else LOCAL_TIME[self.city]


def scenarios() -> list[Scenario]:
    """Every (tool, city) question, in a fixed order."""
    out = []
    for city in CITIES:
        out.append(Scenario(f"What's the weather like in {city} right now?", "get_weather", city))
        out.append(Scenario(f"What time is it in {city}?", "get_time", city))
    return out


def build_graph(llm: Any, *, max_tool_rounds: int = 2, force_first_tool: bool = True) -> Any:
    """The agent graph. ``llm`` is any LangChain chat model.

    ``force_first_tool`` makes the first turn call a tool (``tool_choice="required"``): small
    models rarely call tools on their own, and the reward is about choosing the right one.
    After ``max_tool_rounds`` tool turns the model must answer.
    """
    # strict: the tool schemas forbid extra arguments (the gateway enforces them when forced).
    first = llm.bind_tools(
        TOOLS, tool_choice="required" if force_first_tool else "auto", strict=True
    )
    later = llm.bind_tools(TOOLS, tool_choice="auto", strict=True)
    final = llm.bind_tools(TOOLS, tool_choice="none", strict=True)

    async def agent(state: MessagesState) -> dict[str, Any]:
        rounds = sum(1 for m in state["messages"] if isinstance(m, ToolMessage))
        model = first if rounds == 0 else later if rounds < max_tool_rounds else final
        messages = [("system", SYSTEM_PROMPT), *state["messages"]]
        return {"messages": [await model.ainvoke(messages)]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(TOOLS))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile()


def reward(scenario: Scenario, messages: list[BaseMessage]) -> tuple[float, dict[str, float]]:
    """Partial credit: the right tool first (0.4), the right city (0.3), the fact in the answer (0.3).

    Example:
        >>> reward(scenarios()[0], [])
        (0.0, {'right_tool': 0.0, 'right_city': 0.0, 'answered': 0.0, 'tool_calls': 0.0})
    """
    calls = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    first = calls[0] if calls else None
    right_tool = float(first is not None and first["name"] == scenario.tool)
    right_city = float(first is not None and first["args"].get("city") == scenario.city)
    last = messages[-1] if messages else None
    text = last.content if isinstance(last, AIMessage) and isinstance(last.content, str) else ""
    answered = float(scenario.fact.split(",")[0].lower() in text.lower())
    metrics = {
        "right_tool": right_tool,
        "right_city": right_city,
        "answered": answered,
        "tool_calls": float(len(calls)),
    }
    return 0.4 * right_tool + 0.3 * right_city + 0.3 * answered, metrics


def transcript(messages: list[BaseMessage]) -> str:
    """A one-line view of a run, for printing."""
    parts = []
    for m in messages:
        if isinstance(m, AIMessage) and m.tool_calls:
            parts.append(" ".join(f"{c['name']}({json.dumps(c['args'])})" for c in m.tool_calls))
        elif isinstance(m, AIMessage | ToolMessage):
            parts.append(repr(str(m.content)[:60]))
    return " -> ".join(parts)
