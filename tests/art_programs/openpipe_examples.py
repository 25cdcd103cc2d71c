"""Run OpenPipe ART's own example programs against art-core, changing only the lines a port
may change, and check that they train.

ART's code is not part of this repository: point ``--art`` at a checkout of
https://github.com/OpenPipe/ART (a work tree, or a bare git folder whose HEAD is read). For
each example (``examples/2048``, ``examples/tic_tac_toe``) the program's files are copied as
they are into a scratch folder; the only edit is the ``base_model=...`` line, which names a
stand-in (tiny-random fine-tuned to answer in the game's ``<move>...</move>`` format, on
games played with ART's own game code: the 7-8B instruct models ART names cannot run
here). ``import art`` / ``from art.local import LocalBackend`` resolve through art-core's
opt-in alias, so the import lines stay as they are, and so does ``LocalBackend()``.

What the programs need besides art-core is provided as a user would: ``python-dotenv``,
``weave`` and ``requests`` from the dev environment, OpenPipe's reporting client
(``openpipe``, installed with ``--no-deps`` into a cache folder: it pins an older openai, and
the examples only call it when ``OPENPIPE_API_KEY`` is set), and an S3 bucket (``BACKUP_BUCKET``)
on a local S3 server (moto) for ``_experimental_pull_from_s3`` / ``_experimental_push_to_s3``.

Each program runs until its first training step has written checkpoint 1 (and, where it
pushes after training, until that checkpoint is in the bucket); then it is stopped, since
ART's loops run for 50-100 steps. The report lists every changed line and whether the step
trained: the trajectories matched their recorded calls and the adapter moved.

    python tests/art_programs/openpipe_examples.py --art /path/to/ART
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

OPENPIPE_VERSION = "5.0.0"
BUCKET = "art-examples"


@dataclass
class Example:
    folder: str  # under the ART checkout
    files: tuple[str, ...]
    script: str
    project: str
    model_name: str
    # whether the program pushes to S3 after its train step (then the run waits for it)
    pushes_after_train: bool


EXAMPLES = {
    "2048": Example(
        "examples/2048",
        ("2048.py", "rollout.py", "utils.py"),
        "2048.py",
        "2048",
        "003",
        False,
    ),
    "tic_tac_toe": Example(
        "examples/tic_tac_toe",
        ("tic-tac-toe.py", "rollout.py", "game_utils.py"),
        "tic-tac-toe.py",
        "tic-tac-toe",
        "llama-8b-007",
        True,
    ),
}


# ------------------------------------------------------------------------------ ART's files
def read_art_file(art: Path, relative: str) -> str:
    """A file of the ART checkout: from its work tree, or from HEAD of a bare repository."""
    if (art / relative).is_file():
        return (art / relative).read_text()
    return subprocess.run(
        ["git", "--git-dir", str(art), "show", f"HEAD:{relative}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def copy_example(art: Path, example: Example, into: Path) -> dict[str, str]:
    """The example's files, unchanged, in ``into`` (emptied first); their texts by name."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    texts = {}
    for name in example.files:
        texts[name] = read_art_file(art, f"{example.folder}/{name}")
        (into / name).write_text(texts[name])
    return texts


BASE_MODEL_LINE = re.compile(r'^(\s*base_model=)"[^"]*"(,?\s*)$', re.MULTILINE)


def port(text: str, base_model: str) -> str:
    """The one edit: the ``base_model="..."`` argument names the stand-in."""
    ported, count = BASE_MODEL_LINE.subn(lambda m: f'{m[1]}"{base_model}"{m[2]}', text)
    if count != 1:
        raise SystemExit(f"expected one base_model=... line, found {count}")
    return ported


def changed_lines(name: str, before: str, after: str) -> list[str]:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), name, name, n=0)
    return [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]


# ------------------------------------------------------------------------------ stand-ins
def load_module(path: Path, name: str) -> ModuleType:
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(path.parent))


def system_prompt_of(rollout_source: str) -> Callable[[dict[str, Any]], str]:
    """The system message the example's rollout writes (a constant or an f-string over
    ``game``), read from its source so the stand-in trains on ART's own prompt."""
    for node in ast.walk(ast.parse(rollout_source)):
        if isinstance(node, ast.Dict):
            fields = {
                k.value: v
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant)
            }
            role = fields.get("role")
            if isinstance(role, ast.Constant) and role.value == "system" and "content" in fields:
                code = compile(ast.Expression(fields["content"]), "<prompt>", "eval")
                return lambda game: str(eval(code, {"game": game}))
    raise SystemExit("no system message found in the rollout")


def conversations_2048(folder: Path, games: int, seed: int) -> list[list[dict[str, str]]]:
    """Whole games played with random moves by ART's own 2048 code, in its prompt and
    format. Only ``left`` and ``up``: the board fills within a few dozen moves, so the
    stand-in's games end (and their rewards differ) before a slip ends them at -1."""
    utils = load_module(folder / "utils.py", "art_example_2048_utils")
    prompt = system_prompt_of((folder / "rollout.py").read_text())
    random.seed(seed)
    out = []
    for _ in range(games):
        game = utils.generate_game()
        messages = [{"role": "system", "content": prompt(game)}]
        for _ in range(200):
            messages.append({"role": "user", "content": utils.render_board(game)})
            move = f"<move>{random.choice(['left', 'up'])}</move>"
            messages.append({"role": "assistant", "content": move})
            utils.apply_agent_move(game, move)
            if utils.check_game_finished(game):
                break
        out.append(messages)
    return out


def conversations_tic_tac_toe(folder: Path, games: int, seed: int) -> list[list[dict[str, str]]]:
    """Games with random valid moves, played by ART's own tic-tac-toe code."""
    utils = load_module(folder / "game_utils.py", "art_example_ttt_utils")
    prompt = system_prompt_of((folder / "rollout.py").read_text())
    random.seed(seed)
    out = []
    for _ in range(games):
        game = utils.generate_game()
        messages = [{"role": "system", "content": prompt(game)}]
        if game["agent_symbol"] == "o":
            row, col = utils.get_opponent_move(game)
            game["board"][row][col] = game["opponent_symbol"]
        while utils.check_winner(game["board"]) is None:
            messages.append({"role": "user", "content": utils.render_board(game)})
            empty = [(r, c) for r in range(3) for c in range(3) if game["board"][r][c] == "_"]
            row, col = random.choice(empty)
            move = f"<move>{'ABC'[row]}{col + 1}</move>"
            messages.append({"role": "assistant", "content": move})
            utils.apply_agent_move(game, move)
            if utils.check_winner(game["board"]) is not None:
                break
            row, col = utils.get_opponent_move(game)
            game["board"][row][col] = game["opponent_symbol"]
        out.append(messages)
    return out


# ------------------------------------------------------------------------------ environment
def openpipe_client(cache: Path) -> Path:
    """A folder holding OpenPipe's client (``--no-deps``: it pins openai <= 1.97; the
    examples import it and call it only with an API key)."""
    target = cache / f"openpipe-{OPENPIPE_VERSION}"
    if not (target / "openpipe").is_dir():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
             f"openpipe=={OPENPIPE_VERSION}"],
            check=True,
        )  # fmt: skip
    return target


def alias_site(folder: Path) -> Path:
    """A site folder whose ``.pth`` answers ``import art`` with art-core."""
    from art_core.cli import main

    site = folder / "site-packages"
    if main(["art-alias", "install", "--site", str(site)]) != 0:
        raise SystemExit("art-core art-alias install failed")
    return site


# ------------------------------------------------------------------------------ running
def history(model_dir: Path) -> list[dict[str, Any]]:
    path = model_dir / "history.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trained_record(model_dir: Path) -> dict[str, Any] | None:
    for record in history(model_dir):
        if "checkpoint_step" in record and "train/trajectories_without_calls" in record:
            return record
    return None


def adapter_moved(model_dir: Path, step: int) -> bool:
    """LoRA B starts at zero: a trained step-1 adapter has a non-zero B somewhere."""
    import numpy as np
    from safetensors.numpy import load_file

    weights = load_file(model_dir / "checkpoints" / f"{step:04d}" / "adapter_model.safetensors")
    return any(np.any(value != 0) for key, value in weights.items() if "lora_B" in key)


def objects(s3: Any, prefix: str) -> int:
    """How many objects the bucket holds under ``prefix`` (0 while it does not exist)."""
    try:
        return int(s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("KeyCount", 0))
    except s3.exceptions.NoSuchBucket:
        return 0


def run_example(
    name: str, example: Example, art: Path, work: Path, env: dict[str, str], s3: Any, timeout: float
) -> dict[str, Any]:
    folder = work / name
    originals = copy_example(art, example, folder)
    print(f"[{name}] building the stand-in on games played by ART's own code", flush=True)
    from art_core.testing.fine_tuned import fine_tuned_stand_in

    if name == "2048":
        conversations = conversations_2048(folder, 16, seed=0)
        stand_in = fine_tuned_stand_in("art-2048", conversations, steps=1500, learning_rate=1e-2)
    else:
        conversations = conversations_tic_tac_toe(folder, 40, seed=0)
        stand_in = fine_tuned_stand_in("art-ttt", conversations, steps=200, learning_rate=1e-2)
    stand_in = stand_in.resolve()  # the program runs in its own folder
    changes = []
    for file_name, text in originals.items():
        ported = port(text, str(stand_in)) if file_name == example.script else text
        (folder / file_name).write_text(ported)
        changes += [
            f"{example.folder}/{file_name}: {line}"
            for line in changed_lines(file_name, text, ported)
        ]

    model_dir = folder / ".art" / example.project / "models" / example.model_name
    prefix = f"{example.project}/models/{example.model_name}/"
    command = [sys.executable, example.script]
    print(f"[{name}] {' '.join(command)} (in {folder})", flush=True)
    started = time.monotonic()
    log = (folder / "run.log").open("w")
    process = subprocess.Popen(
        command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    record, outcome = None, "timeout"
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            outcome = f"exited {process.returncode}"
            break
        record = trained_record(model_dir)
        if record is not None:
            if not example.pushes_after_train:
                outcome = "trained"
                break
            if objects(s3, prefix + "checkpoints/0001/"):
                outcome = "trained and pushed"
                break
        time.sleep(2)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
    log.close()
    record = record or trained_record(model_dir)
    pushed = objects(s3, prefix)
    result = {
        "example": name,
        "outcome": outcome,
        "minutes": round((time.monotonic() - started) / 60, 1),
        "changed_lines": changes,
        "objects_in_bucket": pushed,
    }
    if record is not None:
        step = int(record["checkpoint_step"])
        result.update(
            step=step,
            trajectories=record.get("train/num_trajectories"),
            trajectories_without_calls=record["train/trajectories_without_calls"],
            reward=record.get("train/reward"),
            reward_std=record.get("train/reward_std"),
            adapter_moved=adapter_moved(model_dir, step),
        )
    else:
        result["log_tail"] = (folder / "run.log").read_text()[-3000:]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--art", type=Path, required=True, help="an OpenPipe/ART checkout")
    parser.add_argument("--examples", nargs="*", default=list(EXAMPLES), choices=list(EXAMPLES))
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: temp)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per example")
    args = parser.parse_args()

    import boto3
    from moto.server import ThreadedMotoServer

    work = args.work or Path(tempfile.mkdtemp(prefix="art-examples-"))
    work.mkdir(parents=True, exist_ok=True)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port_number = server.get_host_and_port()
    s3_env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port_number}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "BACKUP_BUCKET": BUCKET,
    }
    os.environ.update(s3_env)
    s3 = boto3.client("s3")
    site = alias_site(work)
    openpipe = openpipe_client(Path.home() / ".cache" / "art_core")
    env = {
        **os.environ,
        **s3_env,
        # the alias's .pth runs from a site folder; openpipe's client from its own folder
        "PYTHONPATH": os.pathsep.join([str(openpipe), os.environ.get("PYTHONPATH", "")]),
        "TQDM_DISABLE": "1",
        "WEAVE_IMPLICITLY_PATCH_INTEGRATIONS": "false",
    }
    # `python script.py` with the alias: sitecustomize is simplest for a plain command line.
    custom = work / "sitecustomize"
    custom.mkdir(exist_ok=True)
    (custom / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(site)!r})\n")
    env["PYTHONPATH"] = os.pathsep.join([str(custom), env["PYTHONPATH"]])
    results = []
    try:
        for name in args.examples:
            results.append(run_example(name, EXAMPLES[name], args.art, work, env, s3, args.timeout))
    finally:
        server.stop()
    print(json.dumps(results, indent=2))
    return (
        0
        if all(r.get("adapter_moved") and r.get("trajectories_without_calls") == 0 for r in results)
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
