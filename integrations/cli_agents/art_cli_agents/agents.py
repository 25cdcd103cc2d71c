"""A command-line agent: the command that runs it on a prompt, and the configuration it reads.

Any agent in any language works if it can be pointed at a base URL: the gateway speaks Chat
Completions, Responses, Anthropic Messages and Completions, and the run's environment carries
the rollout's URLs and key (``art.capture(model).env()``: ``OPENAI_BASE_URL``,
``ANTHROPIC_BASE_URL``, ...). Command arguments, environment values and configuration files
are templates (``string.Template``: ``${prompt}``, ``${model}``, ``${openai_base_url}``,
``${anthropic_base_url}``, ``${api_key}``, ``${home}``, ``${workdir}``), filled in for each
run; configuration files are written under the run's own empty ``HOME``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from string import Template


@dataclass(frozen=True)
class CLIAgent:
    """How to run one command-line agent.

    Example:
        >>> agent = CLIAgent("echo", ["my-agent", "--model", "${model}", "${prompt}"])
        >>> agent.command({"model": "m", "prompt": "fix it"})
        ['my-agent', '--model', 'm', 'fix it']
    """

    name: str
    argv: Sequence[str]
    # Files written under the run's HOME before it starts: relative path -> template.
    files: Mapping[str, str] = field(default_factory=dict)
    # Variables added to the run's environment (after the rollout's own): name -> template.
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError(f"agent {self.name!r} has an empty command")
        for path in self.files:
            if path.startswith("/") or ".." in path.split("/"):
                raise ValueError(f"agent {self.name!r}: {path!r} is not a path inside HOME")

    def command(self, values: Mapping[str, str]) -> list[str]:
        """The command line for one run."""
        return [Template(arg).safe_substitute(values) for arg in self.argv]

    def environment(self, values: Mapping[str, str]) -> dict[str, str]:
        """The agent's own environment variables for one run."""
        return {k: Template(v).safe_substitute(values) for k, v in self.env.items()}

    def config_files(self, values: Mapping[str, str]) -> dict[str, str]:
        """The configuration files of one run (relative to its HOME) and their text."""
        return {path: Template(text).safe_substitute(values) for path, text in self.files.items()}


CODEX_CONFIG = """\
model = "${model}"
model_provider = "art"

[model_providers.art]
name = "art-core gateway"
base_url = "${openai_base_url}"
wire_api = "responses"
env_key = "OPENAI_API_KEY"
"""


def codex(
    binary: str = "codex", *, sandbox: str = "workspace-write", extra_args: Sequence[str] = ()
) -> CLIAgent:
    """OpenAI's Codex CLI (npm ``@openai/codex``), non-interactive (``codex exec``), with a
    model provider that points at the rollout (it speaks the Responses API).

    Example:
        >>> codex("/opt/agents/bin/codex").argv[:2]
        ['/opt/agents/bin/codex', 'exec']
    """
    return CLIAgent(
        "codex",
        [binary, "exec", "--skip-git-repo-check", "--sandbox", sandbox, *extra_args, "${prompt}"],
        files={".codex/config.toml": CODEX_CONFIG},
    )


def claude_code(
    binary: str = "claude",
    *,
    max_output_tokens: int | None = None,
    permission_mode: str = "acceptEdits",
    extra_args: Sequence[str] = (),
) -> CLIAgent:
    """Anthropic's Claude Code (npm ``@anthropic-ai/claude-code``), non-interactive
    (``claude -p``); it speaks the Messages API to ``ANTHROPIC_BASE_URL``. Telemetry, update
    checks and other traffic are off. ``max_output_tokens`` caps each answer (it asks for
    32000 by default, which the gateway lowers to what the context leaves).

    Example:
        >>> claude_code("claude", max_output_tokens=256).env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]
        '256'
    """
    env = {
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    if max_output_tokens is not None:
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(max_output_tokens)
    return CLIAgent(
        "claude-code",
        [
            binary,
            "-p",
            "${prompt}",
            "--model",
            "${model}",
            "--permission-mode",
            permission_mode,
            *extra_args,
        ],
        env=env,
    )
