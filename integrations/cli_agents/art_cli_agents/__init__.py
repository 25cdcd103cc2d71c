"""Train any command-line agent with art-core, unchanged.

Example:
    >>> import art_cli_agents as cli
    >>> task = cli.Task("Fix the failing test", folder="tasks/bug", check="python -m pytest -q")
    >>> group = await cli.rollout_group(model, cli.codex(), task, 4)  # needs a registered model, and the codex CLI (an npm install)  # doctest: +SKIP
"""

from art_cli_agents.agents import (
    CLAUDE_CODE_SMALL_MODEL_PROMPT,
    CODEX_SMALL_MODEL_PROMPT,
    OPENCODE_SMALL_MODEL_PROMPT,
    CLIAgent,
    claude_code,
    codex,
    opencode,
    small_model_prompt,
)
from art_cli_agents.clock import fixed_clock, libfaketime
from art_cli_agents.rollout import Task, reward_of, rollout, rollout_group
from art_cli_agents.sandbox import Limits, ProcessResult, isolation_prefix, run_sandboxed
from art_cli_agents.tasks import load_task, load_tasks
from art_cli_agents.train import (
    CLITrainKwargs,
    CLITrainSettings,
    StepRecord,
    TrainReport,
    train,
    train_settings,
)

__all__ = [
    "CLAUDE_CODE_SMALL_MODEL_PROMPT",
    "CODEX_SMALL_MODEL_PROMPT",
    "OPENCODE_SMALL_MODEL_PROMPT",
    "CLIAgent",
    "CLITrainKwargs",
    "CLITrainSettings",
    "Limits",
    "ProcessResult",
    "StepRecord",
    "Task",
    "TrainReport",
    "claude_code",
    "codex",
    "fixed_clock",
    "isolation_prefix",
    "libfaketime",
    "load_task",
    "load_tasks",
    "opencode",
    "reward_of",
    "rollout",
    "rollout_group",
    "run_sandboxed",
    "small_model_prompt",
    "train",
    "train_settings",
]
