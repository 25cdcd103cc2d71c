"""Train any command-line agent with art-core, unchanged.

Example:
    >>> import art_cli_agents as cli
    >>> task = cli.Task("Fix the failing test", folder="tasks/bug", check="python -m pytest -q")
    >>> group = await cli.rollout_group(model, cli.codex(), task, 4)  # doctest: +SKIP
"""

from art_cli_agents.agents import CLIAgent, claude_code, codex
from art_cli_agents.rollout import Task, reward_of, rollout, rollout_group
from art_cli_agents.sandbox import Limits, ProcessResult, isolation_prefix, run_sandboxed

__all__ = [
    "CLIAgent",
    "Limits",
    "ProcessResult",
    "Task",
    "claude_code",
    "codex",
    "isolation_prefix",
    "reward_of",
    "rollout",
    "rollout_group",
    "run_sandboxed",
]
