"""Acceptance 2 and hand-built graphs: structured output, subgraphs, conditional edges,
parallel branches, sync nodes (thread pool), sync ``invoke`` and ``stream_mode="messages"``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal

import art_langgraph
import pytest
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph_support import TOOLS, tool_names
from pydantic import BaseModel
from typing_extensions import TypedDict

import art_core as art
from art_core.testing.checks import assert_token_exact

LLM = art_langgraph.init_chat_model(max_tokens=64)


class Verdict(BaseModel):
    """Which research branch a question needs."""

    topic: Literal["weather", "time"]
    urgent: bool


class Grade(BaseModel):
    """A grade for the research."""

    score: Literal[0, 1, 2]


class ResearchState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    verdict: Verdict | None
    grade: Grade | None


def research_subgraph(tool_name: str) -> Any:
    """A subgraph: a sync node that makes a forced tool call, then the tool node."""

    def draft(state: ResearchState) -> dict[str, Any]:
        bound = LLM.bind_tools(TOOLS, tool_choice=tool_name, strict=True)
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(ResearchState)
    graph.add_node("draft", draft)
    graph.add_node("tools", ToolNode(TOOLS))
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "tools")
    graph.add_edge("tools", END)
    return graph.compile()


async def classify(state: ResearchState) -> dict[str, Any]:
    verdict = await LLM.with_structured_output(Verdict).ainvoke(state["messages"])
    return {"verdict": verdict}


def route(state: ResearchState) -> str:
    assert state["verdict"] is not None
    return state["verdict"].topic


def grade(state: ResearchState) -> dict[str, Any]:
    grader = LLM.with_structured_output(Grade, method="function_calling", strict=True)
    return {"grade": grader.invoke(state["messages"])}


def structured_graph() -> Any:
    graph = StateGraph(ResearchState)
    graph.add_node("classify", classify)
    graph.add_node("weather_research", research_subgraph("lookup_weather"))
    graph.add_node("time_research", research_subgraph("lookup_time"))
    graph.add_node("grade", grade)
    graph.add_edge(START, "classify")
    graph.add_conditional_edges(
        "classify", route, {"weather": "weather_research", "time": "time_research"}
    )
    graph.add_edge("weather_research", "grade")
    graph.add_edge("time_research", "grade")
    graph.add_edge("grade", END)
    return graph.compile()


async def test_structured_output_and_subgraph_calls_are_captured(
    langgraph_model: art.TrainableModel, langgraph_tokenizer: Any
) -> None:
    graph = structured_graph()
    finals: dict[int, dict[str, Any]] = {}

    async def play(i: int) -> float:
        finals[i] = await graph.ainvoke({"messages": [("user", f"task {i}: Lima?")]})
        return 1.0

    rollout = art_langgraph.wrap_rollout(langgraph_model, play)
    trajectories = await asyncio.gather(*(rollout(i) for i in range(4)))
    for i, trajectory in enumerate(trajectories):
        final = finals[i]
        verdict, graded = final["verdict"], final["grade"]
        classify_call, draft_call, grade_call = trajectory.calls
        assert [c.metadata["langgraph_node"] for c in trajectory.calls] == [
            "classify",
            "draft",
            "grade",
        ]
        # with_structured_output (json_schema): the parsed object is the recorded answer
        assert classify_call.request_params["response_format"]["type"] == "json_schema"
        assert json.loads(classify_call.response_message["content"]) == verdict.model_dump()
        # the conditional edge took the branch the model chose; the call inside the subgraph
        # carries the path of nodes down to it
        branch = f"{verdict.topic}_research"
        assert draft_call.metadata["langgraph_node_path"] == [branch, "draft"]
        expected_tool = "lookup_weather" if verdict.topic == "weather" else "lookup_time"
        assert tool_names(draft_call) == [expected_tool]
        # the subgraph's ToolNode result reached the next call, in order
        [tool_result] = [m for m in final["messages"] if isinstance(m, ToolMessage)]
        assert f"[{trajectory.id}]" in tool_result.content
        assert grade_call.messages[-1]["content"] == tool_result.content
        # with_structured_output (function calling): a forced call of the schema's tool
        assert tool_names(grade_call) == ["Grade"]
        arguments = grade_call.response_message["tool_calls"][0]["function"]["arguments"]
        assert json.loads(arguments) == graded.model_dump()
        assert all(f"task {i}:" in c.messages[0]["content"] for c in trajectory.calls)
        for call in trajectory.calls:
            assert (
                langgraph_tokenizer.decode(call.completion_token_ids, skip_special_tokens=False)
                == call.completion_text
            )
        # grade sees draft's conversation, its answer and the tool result (not a token prefix
        # of it: grade offers other tools, so the rendered system prompt differs)
        k = len(draft_call.messages)
        assert grade_call.messages[:k] == draft_call.messages
        assert grade_call.messages[k]["tool_calls"][0]["function"]["name"] == expected_tool


# ---------------------------------------------------------------- parallel branches, sync runs
PLANNER = LLM.bind_tools(TOOLS, tool_choice="required", strict=True, parallel_tool_calls=False)
# The writers offer the same tools as the plan (but may not call them), so their prompts
# render the same system turn and continue the plan call token-exactly.
WRITER = LLM.bind_tools(TOOLS, tool_choice="none", strict=True, max_tokens=6)


def plan(state: MessagesState) -> dict[str, Any]:
    return {"messages": [PLANNER.invoke(state["messages"])]}


async def aplan(state: MessagesState) -> dict[str, Any]:
    return {"messages": [await PLANNER.ainvoke(state["messages"])]}


def planned_tool(state: MessagesState) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


def write(state: MessagesState) -> dict[str, Any]:
    return {"messages": [WRITER.invoke(state["messages"])]}


async def awrite(state: MessagesState) -> dict[str, Any]:
    return {"messages": [await WRITER.ainvoke(state["messages"])]}


def branching_graph() -> Any:
    """plan -> (conditional) tools -> writer_sync || writer_async (parallel) -> END.

    ``writer_sync`` is a plain function (LangGraph runs it in a thread pool even under
    ``ainvoke``); ``plan`` and ``writer_async`` have a sync and an async body, so the same
    graph also runs with the sync ``invoke``.
    """
    graph = StateGraph(MessagesState)
    graph.add_node("plan", RunnableLambda(plan, afunc=aplan))
    graph.add_node("tools", ToolNode(TOOLS))
    graph.add_node("writer_sync", write)
    graph.add_node("writer_async", RunnableLambda(write, afunc=awrite))
    graph.add_edge(START, "plan")
    graph.add_conditional_edges("plan", planned_tool, ["tools", END])
    graph.add_edge("tools", "writer_sync")
    graph.add_edge("tools", "writer_async")
    graph.add_edge("writer_sync", END)
    graph.add_edge("writer_async", END)
    return graph.compile()


BRANCHING = branching_graph()


async def run_branching(mode: str, i: int) -> tuple[list[Any], dict[str, str]]:
    """Run the graph one way; returns its final messages and the text streamed per node."""
    state = {"messages": [("user", f"task {i}: Paris?")]}
    streamed: dict[str, str] = {}
    if mode == "ainvoke":
        return (await BRANCHING.ainvoke(state))["messages"], streamed
    if mode == "invoke-in-thread":
        # sync Pregel: nodes run in LangGraph's own thread pool
        return (await asyncio.to_thread(BRANCHING.invoke, state))["messages"], streamed
    final: list[Any] = []
    async for part, meta in BRANCHING.astream(state, stream_mode="messages"):
        node = meta["langgraph_node"]
        if node.startswith("writer") and isinstance(part.content, str):
            streamed[node] = streamed.get(node, "") + part.content
        final.append(part)
    return final, streamed


@pytest.mark.parametrize("mode", ["ainvoke", "invoke-in-thread", "astream-messages"])
async def test_parallel_branches_and_sync_nodes_are_captured(
    mode: str, langgraph_model: art.TrainableModel, langgraph_tokenizer: Any
) -> None:
    streams: dict[int, dict[str, str]] = {}

    async def play(i: int) -> None:
        _, streams[i] = await run_branching(mode, i)

    rollout = art_langgraph.wrap_rollout(langgraph_model, play, metadata={"mode": mode})
    trajectories = await asyncio.gather(*(rollout(i) for i in range(4)))
    for i, trajectory in enumerate(trajectories):
        assert trajectory.metadata == {"mode": mode} and trajectory.reward == 0.0
        first, *writers = trajectory.calls
        assert first.metadata["langgraph_node"] == "plan"
        assert len(tool_names(first)) == 1
        assert sorted(c.metadata["langgraph_node"] for c in writers) == [
            "writer_async",
            "writer_sync",
        ]
        assert {c.metadata["langgraph_step"] for c in writers} == {3}
        for writer in writers:
            assert f"task {i}:" in writer.messages[0]["content"]
            assert writer.messages[-1]["role"] == "tool"
            assert f"[{trajectory.id}]" in writer.messages[-1]["content"]
            # both branches continue the plan call token-exactly
            assert_token_exact(
                trajectory.model_copy(update={"calls": [first, writer]}), langgraph_tokenizer
            )
            if mode == "astream-messages":
                node = writer.metadata["langgraph_node"]
                assert streams[i][node] == writer.response_message["content"]
