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

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from string import Template
from typing import Any


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


def _positive(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def template_text(text: str) -> str:
    """``text`` as it must appear in a template to come out unchanged (``$`` doubled).

    Example:
        >>> Template(template_text("costs $5, ${model}")).safe_substitute({"model": "m"})
        'costs $5, ${model}'
    """
    return text.replace("$", "$$")


# System prompts for small models (Qwen2.5-Coder-0.5B and the like), one per preset: a few
# sentences in place of the agent's own 2-5k tokens, naming its tools with their arguments
# and one example call. Measured with Qwen2.5-Coder-0.5B-Instruct on "create hello.txt
# containing hello" (groups of 4): with the agents' own prompts no run of any agent made a
# call to a tool that exists (each wrote a bare JSON object naming a tool it made up); with
# these, some runs of each succeed (integrations/cli_agents/README.md has the figures).
SMALL_MODEL_PROMPT = (
    "You are a coding agent working in the current folder. Do the user's task by calling "
    "your tools, one call at a time, and read each result. Your tools: {tools} For example, "
    "to create a file notes.txt containing hi, call {example}. When the task is done, reply "
    "with one short sentence."
)


def small_model_prompt(tools: str, example: str) -> str:
    """A system prompt for a small model: ``SMALL_MODEL_PROMPT`` naming ``tools`` (each with
    its arguments, in a sentence) and one ``example`` call that creates a file. For an agent
    given fewer tools than its preset (``claude_code(tools=("Write",))``): a prompt naming only
    those, so the model is not told of tools it cannot call.

    Example:
        >>> prompt = small_model_prompt(
        ...     "Write (file_path, content) creates a file.",
        ...     'Write with {"file_path": "notes.txt", "content": "hi"}',
        ... )
        >>> "Your tools: Write (file_path, content) creates a file. For example" in prompt
        True
    """
    return SMALL_MODEL_PROMPT.format(tools=tools, example=example)


CODEX_SMALL_MODEL_PROMPT = small_model_prompt(
    "exec_command (cmd) runs a shell command: use it to create, read and change files.",
    """exec_command with {"cmd": "printf 'hi' > notes.txt"}""",
)
CLAUDE_CODE_SMALL_MODEL_PROMPT = small_model_prompt(
    "Write (file_path, content) creates a file; Edit (file_path, old_string, "
    "new_string) changes a file; Read (file_path) shows a file; Bash (command) runs a shell "
    "command.",
    'Write with {"file_path": "notes.txt", "content": "hi"}',
)
OPENCODE_SMALL_MODEL_PROMPT = small_model_prompt(
    "write (filePath, content) creates a file; edit (filePath, oldString, newString) "
    "changes a file; read (filePath) shows a file; bash (command, description) runs a shell "
    "command.",
    'write with {"filePath": "notes.txt", "content": "hi"}',
)


CODEX_CONFIG = """\
model = "${model}"
model_provider = "art"
${codex_top}
[model_providers.art]
name = "art-core gateway"
base_url = "${openai_base_url}"
wire_api = "responses"
env_key = "OPENAI_API_KEY"
${codex_tables}"""

# What Codex 0.169 sends beyond its system prompt and its shell tools, and a small model
# does without: sub-agents (a 10 KB tool namespace), goals, image viewing, the hosted web
# search, and the skills instructions. Off, its first request is 24 KB instead of 40 KB
# (5.0k tokens of Qwen2.5's tokenizer instead of 8.6k).
CODEX_LEAN_TOP = 'web_search = "disabled"\n'
CODEX_LEAN_TABLES = """
[agents]
enabled = false

[features]
goals = false
view_image = false

[skills]
include_instructions = false
"""


def codex(
    binary: str = "codex",
    *,
    sandbox: str = "workspace-write",
    all_tools: bool = False,
    system_prompt: str | None = None,
    environment_context: bool = True,
    extra_args: Sequence[str] = (),
) -> CLIAgent:
    """OpenAI's Codex CLI (npm ``@openai/codex``), non-interactive (``codex exec``), with a
    model provider that points at the rollout (it speaks the Responses API).

    By default its sub-agents, goals, image viewing, hosted web search and skills
    instructions are turned off in its ``config.toml``, which leaves more of a small model's
    context to the work; it keeps its own system prompt and shell tools. ``all_tools=True``
    keeps Codex's own defaults. ``system_prompt`` replaces Codex's own instructions (about
    4k tokens; its ``model_instructions_file``), e.g. ``CODEX_SMALL_MODEL_PROMPT``.
    ``environment_context=False`` leaves out the block where it tells the model its folder,
    shell and today's date (``include_environment_context``): its prompts are then the same
    every day, which seeded runs need to replay (``art_cli_agents.clock``).

    Example:
        >>> codex("/opt/agents/bin/codex").argv[:2]
        ['/opt/agents/bin/codex', 'exec']
        >>> "goals = false" in codex().config_files({})[".codex/config.toml"]
        True
        >>> "features" in codex(all_tools=True).config_files({})[".codex/config.toml"]
        False
    """
    lean = {"codex_top": "", "codex_tables": ""}
    if not all_tools:
        lean = {"codex_top": CODEX_LEAN_TOP, "codex_tables": CODEX_LEAN_TABLES}
    # The preset's own parts are filled in now; the run's values (${model}, ...) at each run.
    config = Template(CODEX_CONFIG).safe_substitute(lean)
    # Top-level keys: before the first table of the file.
    top = "" if environment_context else "include_environment_context = false\n"
    files: dict[str, str] = {}
    if system_prompt is not None:
        top += 'model_instructions_file = "${home}/.codex/instructions.md"\n'
        files[".codex/instructions.md"] = template_text(system_prompt)
    files[".codex/config.toml"] = top + config
    return CLIAgent(
        "codex",
        [binary, "exec", "--skip-git-repo-check", "--sandbox", sandbox, *extra_args, "${prompt}"],
        files=files,
    )


# Claude Code's tools for coding in a folder. All its tools (24 in 2.1.197: sub-agents,
# tasks, cron, worktrees, web, notebooks, ...) make a 76 KB first request, 18.8k tokens of
# Qwen2.5's tokenizer: most of a 32k context before any work. These four make 12.6 KB (3.1k).
CLAUDE_CODE_TOOLS = ("Read", "Write", "Edit", "Bash")


def claude_code(
    binary: str = "claude",
    *,
    tools: Sequence[str] | None = CLAUDE_CODE_TOOLS,
    max_output_tokens: int | None = None,
    permission_mode: str = "acceptEdits",
    system_prompt: str | None = None,
    max_turns: int | None = None,
    extra_args: Sequence[str] = (),
) -> CLIAgent:
    """Anthropic's Claude Code (npm ``@anthropic-ai/claude-code``), non-interactive
    (``claude -p``); it speaks the Messages API to ``ANTHROPIC_BASE_URL``. Telemetry, update
    checks and other traffic are off. ``max_output_tokens`` caps each answer (it asks for
    32000 by default, which the gateway lowers to what the context leaves).

    ``tools`` are the built-in tools it gets (``--tools``), each allowed without asking
    (``--allowedTools``: in ``-p`` mode a tool call that needs approval is refused, and
    ``acceptEdits`` approves file edits but not most shell commands); ``None`` gives Claude
    Code's own default, all its tools, with ``permission_mode`` alone deciding.
    ``system_prompt`` replaces its own (``--system-prompt``; 2-3k tokens with these tools),
    e.g. ``CLAUDE_CODE_SMALL_MODEL_PROMPT``. ``max_turns`` bounds its agentic turns
    (``--max-turns``; it then stops with an error, and the check still scores the folder).

    Example:
        >>> claude_code("claude", max_output_tokens=256).env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]
        '256'
        >>> claude_code("claude").argv[-4:]
        ['--tools', 'Read,Write,Edit,Bash', '--allowedTools', 'Read,Write,Edit,Bash']
        >>> "--tools" in claude_code("claude", tools=None).argv
        False
    """
    env = {
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    if max_output_tokens is not None:
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(max_output_tokens)
    tool_args: list[str] = []
    if tools is not None:
        names = ",".join(tools)
        tool_args = ["--tools", names, "--allowedTools", names]
    if system_prompt is not None:
        tool_args += ["--system-prompt", template_text(system_prompt)]
    if max_turns is not None:
        tool_args += ["--max-turns", str(_positive(max_turns, "max_turns"))]
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
            *tool_args,
        ],
        env=env,
    )


# opencode's permissions (names of its tools; "edit" covers write and patch) for coding in a
# folder. Its ten default tools (with sub-agents, todos, web fetch, skills, glob, grep) make a
# 31 KB first request (7.2k tokens of Qwen2.5's tokenizer); these make 19 KB (4.5k).
OPENCODE_TOOLS = ("read", "edit", "bash")


def opencode(
    binary: str = "opencode",
    *,
    tools: Sequence[str] | None = OPENCODE_TOOLS,
    max_output_tokens: int | None = None,
    system_prompt: str | None = None,
    max_turns: int | None = None,
    extra_args: Sequence[str] = (),
) -> CLIAgent:
    """opencode (npm ``opencode-ai``), non-interactive (``opencode run``), with a provider
    (``@ai-sdk/openai-compatible``) at the rollout in ``~/.config/opencode/opencode.json``: it
    speaks Chat Completions. Update checks, sharing and the models.dev catalogue fetch are
    off; it runs offline. ``max_output_tokens`` caps each answer (it asks for 32000 by
    default, which the gateway lowers to what the context leaves).

    ``tools`` are the permissions allowed without asking (opencode's tool names; ``edit``
    covers ``write``): every other tool is denied, which leaves it out of the request.
    ``None`` allows everything, and it sends all its default tools. Paths outside the folder
    are allowed either way (the run's sandbox bounds it). The session gets a fixed title
    (``--title``), which saves the extra call opencode makes to have the model write one.
    ``system_prompt`` replaces its ``build`` agent's prompt (its environment and tool
    descriptions stay), e.g. ``OPENCODE_SMALL_MODEL_PROMPT``. ``max_turns`` bounds its
    agentic iterations (the agent's ``steps``: then it must answer in text, without tools).

    Example:
        >>> agent = opencode("/opt/agents/bin/opencode", max_output_tokens=64)
        >>> agent.command({"prompt": "fix it"})
        ['/opt/agents/bin/opencode', 'run', '--title', 'art rollout', '--', 'fix it']
        >>> config = json.loads(agent.config_files({"model": "m"})[".config/opencode/opencode.json"])
        >>> config["model"], config["permission"]["bash"], config["provider"]["art"]["models"]
        ('art/m', 'allow', {'m': {'name': 'm', 'limit': {'context': 0, 'output': 64}}})
    """
    permission: dict[str, str] | str = "allow"
    if tools is not None:
        # The last matching rule wins, and these come after opencode's own (which ask before
        # reading .env files or repeating a call three times).
        permission = {
            "*": "deny",
            **dict.fromkeys(tools, "allow"),
            "external_directory": "allow",
            "doom_loop": "allow",
        }
    model: dict[str, Any] = {"name": "${model}"}
    if max_output_tokens is not None:
        # A context of 0 is opencode's "unknown": it never compacts the conversation itself.
        model["limit"] = {"context": 0, "output": max_output_tokens}
    config = {
        "provider": {
            "art": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "art-core gateway",
                "options": {"baseURL": "${openai_base_url}", "apiKey": "${api_key}"},
                "models": {"${model}": model},
            }
        },
        "model": "art/${model}",
        "small_model": "art/${model}",
        "autoupdate": False,
        "share": "disabled",
        "permission": permission,
    }
    build: dict[str, Any] = {}
    if system_prompt is not None:
        build["prompt"] = template_text(system_prompt)
    if max_turns is not None:
        build["steps"] = _positive(max_turns, "max_turns")
    if build:
        config["agent"] = {"build": build}
    return CLIAgent(
        "opencode",
        # "--": a prompt that starts with "-" is not an option.
        [binary, "run", "--title", "art rollout", *extra_args, "--", "${prompt}"],
        files={".config/opencode/opencode.json": json.dumps(config, indent=2) + "\n"},
        env={
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        },
    )
