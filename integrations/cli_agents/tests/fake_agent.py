"""A command-line agent for the tests: a plain program that reads the rollout's URLs from its
environment, as real agents do, and reports what it saw of its sandbox.

Modes (argv[1]): ``work`` (two chat calls, a forced tool call and its result sent back, then
one Responses call; writes answer.txt), ``probe HOST PORT`` (can it reach an address other
than the gateway?), ``flood N`` (writes N bytes to stdout), ``escape TARGET...`` (which TARGETs,
absolute paths outside its folders, it sees; then tries to write each directly, through
``..`` and through links it makes, and to write where a run may; prints it all as JSON), ``tree MARKER
exit|hang`` (starts a child, a child in a session of its own, and a double-forked daemon that
ignores SIGTERM, all with MARKER as their name; then exits, or hangs ignoring SIGTERM itself),
``bomb N`` (starts up to N sleeping processes, until the system refuses; prints how many),
``paths [WORD...]`` (reports where it runs: its cwd, ``HOME``, ``TMPDIR``, the ``XDG_*``
folders, ``PWD``, the WORDs and ``FAKE_PATHS`` (an agent's templates), the file
``$HOME/.config/fake/paths`` and what its cwd, ``HOME`` and ``TMPDIR`` hold; then leaves a
mark of its own, ``mark-<random>``, in each of the three; prints it all as JSON), ``turns
SECONDS`` (a chat call, then its count written to ``turns.txt`` at once, then SECONDS of
"tool work"; again, forever: an agent with no turn bound of its own).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import time

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Lima"]}},
            "required": ["city"],
        },
    },
}


def work() -> None:
    from openai import OpenAI  # here: the other modes start fast, as a timeout test needs

    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    model = os.environ["OPENAI_MODEL"]
    messages = [{"role": "user", "content": "weather in Paris?"}]
    first = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=40,
    )
    call = first.choices[0].message.tool_calls[0]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], max_tokens=4)
    client.responses.create(model=model, input="and tomorrow?", max_output_tokens=4)
    with open("answer.txt", "w") as f:
        f.write("42\n")
    print(
        json.dumps(
            {
                "home": sorted(os.listdir(os.environ["HOME"])),
                "env": sorted(os.environ),
                "cwd_files": sorted(os.listdir(".")),
            }
        )
    )


def turns(seconds: float) -> None:
    from openai import OpenAI

    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    answered = 0
    while True:
        client.chat.completions.create(
            model=os.environ["OPENAI_MODEL"],
            messages=[{"role": "user", "content": f"turn {answered}"}],
            max_tokens=2,
        )
        answered += 1
        with open("turns.txt", "w") as f:  # acting on the answer, at once
            f.write(str(answered))
        time.sleep(seconds)


def probe(host: str, port: int) -> None:
    try:
        socket.create_connection((host, port), timeout=3).close()
        print("reached")
    except OSError as exc:
        print(f"unreachable: {exc}")


def flood(n: int) -> None:
    block = b"x" * 65536
    out = sys.stdout.buffer
    while n > 0:
        out.write(block[: min(n, len(block))])
        n -= len(block)
    out.flush()


def _write(path: str) -> str:
    try:
        with open(path, "w") as f:
            f.write("escaped\n")
        return "written"
    except OSError as exc:
        return f"refused: {exc.strerror}"


def escape(targets: list[str]) -> None:
    tag = os.urandom(4).hex()  # its own names: the check may run this in the same folder
    seen = [target for target in targets if os.path.exists(target)]
    escapes: dict[str, str] = {}
    for i, target in enumerate(targets):
        escapes[f"absolute {target}"] = _write(target)
        escapes[f"dotdot {target}"] = _write(os.path.relpath(target, os.getcwd()))
        # Links it makes to the target's folder and to the target itself, written through.
        os.symlink(os.path.dirname(target), f"folder-link-{tag}-{i}")
        escapes[f"folder link {target}"] = _write(
            os.path.join(f"folder-link-{tag}-{i}", os.path.basename(target) + ".via-link")
        )
        os.symlink(target + ".file-link", f"file-link-{tag}-{i}")
        escapes[f"file link {target}"] = _write(f"file-link-{tag}-{i}")
    # Where a run may write: its folder, HOME, TMPDIR, /tmp, /dev/null, /dev/shm (the last
    # three written and removed: they may be the machine's own, when nothing isolates it).
    allowed = {
        "cwd": "in-cwd.txt",
        "home": os.path.join(os.environ["HOME"], ".config", "in-home.txt"),
        "tmpdir": os.path.join(os.environ["TMPDIR"], "in-tmp.txt"),
        "slash_tmp": f"/tmp/art-test-{tag}",
        "dev_null": "/dev/null",
        "dev_shm": f"/dev/shm/art-test-{tag}",
    }
    os.makedirs(os.path.dirname(allowed["home"]), exist_ok=True)
    written = {name: _write(path) for name, path in allowed.items()}
    for name in ("slash_tmp", "dev_shm"):
        if written[name] == "written":
            os.unlink(allowed[name])
    print(json.dumps({"seen": seen, "escapes": escapes, "allowed": written}))


def _sleeper(marker: str, ignore_term: bool) -> None:
    """Become a `sleep` named ``marker`` (its name is in its command line)."""
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # kept through exec
    os.execv(shutil.which("sleep") or "/bin/sleep", [marker, "600"])


def tree(marker: str, then: str) -> None:
    pid = os.fork()
    if pid == 0:  # a child, in the agent's process group
        _sleeper(marker, False)
    pid = os.fork()
    if pid == 0:  # a child in a session of its own
        os.setsid()
        _sleeper(marker, False)
    pid = os.fork()
    if pid == 0:  # a daemon: a new session, forked again, its parent gone, SIGTERM ignored
        os.setsid()
        if os.fork() == 0:
            _sleeper(marker, True)
        os._exit(0)
    os.waitpid(pid, 0)
    print("tree up", flush=True)
    if then == "hang":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)


def bomb(n: int) -> None:
    sleep = shutil.which("sleep") or "/bin/sleep"
    started = 0
    try:
        while started < n:
            os.posix_spawn(sleep, ["sleep", "600"], {})
            started += 1
    except OSError as exc:
        print(f"refused: {exc.strerror}")
    print(started, flush=True)


def paths(words: list[str]) -> None:
    folders = {"cwd": os.getcwd(), "home": os.environ["HOME"], "tmpdir": os.environ["TMPDIR"]}
    try:
        with open(os.path.join(folders["home"], ".config", "fake", "paths")) as f:
            config: str | None = f.read()
    except OSError:
        config = None
    mark = f"mark-{os.urandom(4).hex()}"
    report = {
        **folders,
        "env": {
            name: os.environ.get(name)
            for name in ("PWD", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "FAKE_PATHS")
        },
        "words": words,
        "config": config,
        "holds": {name: sorted(os.listdir(folder)) for name, folder in folders.items()},
        "mark": mark,
    }
    for folder in folders.values():
        with open(os.path.join(folder, mark), "w") as f:
            f.write(mark)
    print(json.dumps(report))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "work":
        work()
    elif mode == "probe":
        probe(sys.argv[2], int(sys.argv[3]))
    elif mode == "flood":
        flood(int(sys.argv[2]))
    elif mode == "escape":
        escape(sys.argv[2:])
    elif mode == "tree":
        tree(sys.argv[2], sys.argv[3])
    elif mode == "bomb":
        bomb(int(sys.argv[2]))
    elif mode == "paths":
        paths(sys.argv[2:])
    elif mode == "turns":
        turns(float(sys.argv[2]))
