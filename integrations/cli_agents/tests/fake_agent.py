"""A command-line agent for the tests: a plain program that reads the rollout's URLs from its
environment, as real agents do, and reports what it saw of its sandbox.

Modes (argv[1]): ``work`` (two chat calls, a forced tool call and its result sent back, then
one Responses call; writes answer.txt), ``probe HOST PORT`` (can it reach an address other
than the gateway?), ``linger MARKER`` (starts a detached child with MARKER in its command line, sleeps), ``flood N``
(writes N bytes to stdout).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from openai import OpenAI

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


def probe(host: str, port: int) -> None:
    try:
        socket.create_connection((host, port), timeout=3).close()
        print("reached")
    except OSError as exc:
        print(f"unreachable: {exc}")


def linger(marker: str) -> None:
    subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", marker], start_new_session=True
    )
    print("started", flush=True)
    time.sleep(600)


def flood(n: int) -> None:
    block = b"x" * 65536
    out = sys.stdout.buffer
    while n > 0:
        out.write(block[: min(n, len(block))])
        n -= len(block)
    out.flush()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "work":
        work()
    elif mode == "probe":
        probe(sys.argv[2], int(sys.argv[3]))
    elif mode == "linger":
        linger(sys.argv[2])
    elif mode == "flood":
        flood(int(sys.argv[2]))
