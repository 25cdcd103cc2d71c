"""art_mcp: train a model to use any MCP server's tools with art-core.

Point it at a server (a command line for stdio, or a URL for streamable HTTP); it lists the
tools, runs the agent loop through the art-core gateway (token-exact capture), writes tasks
with any OpenAI-compatible model, scores runs with your reward or RULER, and trains.

Example:
    >>> import art_mcp
    >>> scenarios = await art_mcp.generate_scenarios("mcp-server-time", 16,
    ...                                              generator_model="gpt-4.1")  # needs a network service: a hosted generator model  # doctest: +SKIP
    >>> trajectory = await art_mcp.rollout(model, scenarios[0], "mcp-server-time")  # needs a registered model  # doctest: +SKIP
    >>> report = await art_mcp.train(model, "mcp-server-time", scenarios,
    ...                              judge=art_mcp.Judge("gpt-4.1"))  # needs a registered model, and a hosted judge  # doctest: +SKIP
"""

from art_mcp.generate import ScenarioGenerationError, generate_scenarios
from art_mcp.local import serve_http, spawn_http_server
from art_mcp.report import ValSummary, before_after_table
from art_mcp.rewards import answer_reward, contains_answer, tool_calls, tool_results
from art_mcp.rollout import RewardFn, RolloutSettings, rollout
from art_mcp.scenarios import Scenario, load_scenarios, save_scenarios
from art_mcp.servers import HttpServer, ServerLike, StdioServer, parse_server
from art_mcp.session import McpSession, ServerConnectionError, ToolOutput, connect
from art_mcp.tools import ToolSet, complete_task_tool, input_schema_to_parameters
from art_mcp.train import (
    Judge,
    MCPTrainKwargs,
    MCPTrainSettings,
    StepRecord,
    TrainReport,
    scenarios_for_step,
    train,
    train_settings,
    validate,
)
from art_mcp.warm_start import WarmStart, WarmStartReport, warm_start

__all__ = [
    "HttpServer",
    "Judge",
    "MCPTrainKwargs",
    "MCPTrainSettings",
    "McpSession",
    "RewardFn",
    "RolloutSettings",
    "Scenario",
    "ScenarioGenerationError",
    "ServerConnectionError",
    "ServerLike",
    "StdioServer",
    "StepRecord",
    "ToolOutput",
    "ToolSet",
    "TrainReport",
    "ValSummary",
    "WarmStart",
    "WarmStartReport",
    "answer_reward",
    "before_after_table",
    "complete_task_tool",
    "connect",
    "contains_answer",
    "generate_scenarios",
    "input_schema_to_parameters",
    "load_scenarios",
    "parse_server",
    "rollout",
    "save_scenarios",
    "scenarios_for_step",
    "serve_http",
    "spawn_http_server",
    "tool_calls",
    "tool_results",
    "train",
    "train_settings",
    "validate",
    "warm_start",
]
