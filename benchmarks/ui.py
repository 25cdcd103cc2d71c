"""The viewer (``art-core ui``) on a big model folder: how fast its pages open.

The goal: a model with 100 steps x 64 rollouts opens its run page in under a second and a
rollout in under 200 ms. This script writes such a folder (seeded, in a few seconds: 100
train steps of 8 groups x 8 rollouts, each rollout an agent run of 3 calls with tool calls
and tool results, ~2,000-token prompts that grow per turn as the trainer's prefix merge
expects, ~60 sampled tokens per call with logprobs, the step's training signal, a history
with a validation record every 10 steps, a checkpoint per step), serves it with
``art-core ui`` in a child process on loopback and times, over real HTTP:

- run page: the HTML shell + ``/api/runs/{project}/{name}`` (what the page fetches);
- step page: ``/api/runs/{project}/{name}/steps/train/{step}``;
- rollout page: the HTML shell + ``.../steps/train/{step}/rollouts/{id}``.

"cold" is the first request of its kind after the server started: for the step and rollout
pages, of a step no page had opened yet (its file is indexed by that request; the median
over a few such steps, the first rollout also loads the tokenizer); the files are in the OS
page cache (just written), so it is the viewer's own work, not the disk's. "warm" is the
median of ``--repeats`` requests (rollouts of steps already opened, as when one clicks a
rollout on its step page). With Debian's chromium and ``playwright`` installed, "browser"
is a headless navigation, on the page's own clock, from its start until the frame showing
the run page's first chart / the rollout's token view is drawn (median of ``--repeats``;
the last row: direct links to rollouts of steps not opened before); below the table, where
that time went (scripts, the API's reply, building the page, drawing it). "goal / ours"
divides the goal by the slowest of the row's columns (> 1: within the goal).

The folder has no ``calls.sqlite``: the viewer never reads it. Validation records every 10
steps come with their trajectories (8 groups x 2); checkpoints are stubs (the viewer only
lists them and reads ``trainer_state.json``).

Run:  .venv/bin/python benchmarks/ui.py [--steps 100] [--rollouts 64] [--repeats 20]
          [--path DIR (write the folder there, or reuse the one written there before)]
      .venv/bin/python benchmarks/ui.py --smoke   (3 steps x 8 rollouts, every path)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _children import spawn, stop, wait_for_url
from _machine import machine_line

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx
import orjson

PROJECT, NAME = "bench", "agent"
GROUP_SIZE = 8
CALLS = 3  # per rollout: two tool calls with their results, then the answer
PROMPT_TOKENS = 2_000  # the first call's prompt: system prompt, tools schema, the task
VAL_EVERY = 10
GOALS_MS = {"run": 1000.0, "rollout": 200.0}
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# ---------------------------------------------------------------------------- the folder
ITEMS = ["router", "headset", "keyboard", "monitor", "webcam", "charger", "speaker", "tablet"]
CITIES = ["Lyon", "Porto", "Leeds", "Graz", "Turin", "Ghent", "Cork", "Bergen"]
ISSUES = [
    "arrived broken",
    "never arrived",
    "was charged twice",
    "is the wrong colour",
    "stopped working after a week",
    "needs a new delivery address",
]
TOOL_NAMES = [
    ("search_orders", "Search the customer's orders by item name or date range.", "query"),
    ("get_order", "The full record of one order: items, payments, shipping events.", "order_id"),
    ("get_customer", "The customer's profile: tier, addresses, open tickets.", "customer_id"),
    ("get_product", "One product: warranty terms, return window, replacement parts.", "sku"),
    ("create_refund", "Refund an order, fully or in part (needs a reason code).", "order_id"),
    ("create_replacement", "Ship a replacement for a damaged or missing item.", "order_id"),
    ("track_shipment", "Carrier events of a shipment, newest first.", "order_id"),
    ("escalate", "Hand the case to a human supervisor with a summary.", "summary"),
    ("complete_task", "Finish the case with a one-line resolution for the ticket.", "resolution"),
]
POLICY_WORDS = (
    "refunds orders customers within days of delivery unless the item was used damaged or "
    "opened; replacements ship from the nearest warehouse; premium tier members get free "
    "returns and priority escalation; never promise a delivery date the carrier did not "
    "confirm; always verify the order belongs to the customer before changing it; quote "
    "prices in the customer's currency; log every action as an internal note"
).split()


def tools_schema() -> list[dict[str, Any]]:
    """The agent's tools, as an OpenAI ``tools`` list."""
    tools = []
    for name, description, argument in TOOL_NAMES:
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": description,
                    "parameters": {
                        "type": "object",
                        "properties": {argument: {"type": "string"}},
                        "required": [argument],
                        "additionalProperties": False,
                    },
                },
            }
        )
    return tools


def render_prefix(system: str, tools: list[dict[str, Any]]) -> str:
    """The system turn as the tool-capable ChatML template renders it."""
    listed = "\n".join(orjson.dumps(tool).decode() for tool in tools)
    return (
        f"<|im_start|>system\n{system}\n\n# Tools\n\nYou may call one or more functions to "
        "assist with the user query.\n\nYou are provided with function signatures within "
        f"<tools></tools> XML tags:\n<tools>\n{listed}\n</tools>\n\nFor each function call, "
        "return a json object with function name and arguments within <tool_call></tool_call>"
        ' XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
        "\n</tool_call><|im_end|>\n"
    )


class Writer:
    """Writes the benchmark's model folder: every id a real tokenizer's, seeded."""

    def __init__(self, art: Path, tokenizer: Any, base_model: Path, seed: int = 0) -> None:
        self.art, self.tokenizer, self.base_model = art, tokenizer, base_model
        self.folder = art / PROJECT / "models" / NAME
        self.vocab = tokenizer.get_vocab_size()
        self.rng = random.Random(seed)
        self.tools = tools_schema()
        # A system prompt long enough that the first prompt is ~PROMPT_TOKENS tokens.
        words: list[str] = ["You are the support agent of an electronics shop."]
        while True:
            self.system = " ".join(words)
            self.prefix_ids = self.encode(render_prefix(self.system, self.tools))
            if len(self.prefix_ids) >= PROMPT_TOKENS - 40:
                break
            words += [self.rng.choice(POLICY_WORDS) for _ in range(12)] + ["."]

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def hex_id(self, prefix: str, digits: int = 32) -> str:
        return f"{prefix}_{self.rng.getrandbits(digits * 4):0{digits}x}"

    def logprobs(self, count: int) -> list[float]:
        # Mostly confident tokens, a few unlikely ones, as a sampler at temperature 1 reports.
        return [-self.rng.expovariate(3.0) * (8.0 if self.rng.random() < 0.05 else 1.0)
                for _ in range(count)]  # fmt: skip

    def rollout(
        self, split: str, step: int, scenario: str, task: str, reward: float, started: float
    ) -> dict[str, Any]:
        rng = self.rng
        rollout_id = self.hex_id("rollout")
        order = f"A{rng.randrange(10_000, 99_999)}"
        item = rng.choice(ITEMS)
        plan = [
            ("get_order", "order_id", order, f"I will open order {order}."),
            (
                rng.choice(["create_refund", "create_replacement", "track_shipment"]),
                "order_id",
                order,
                f"The {item} is in its return window.",
            ),
        ]
        system = {"role": "system", "content": self.system}
        user = {"role": "user", "content": task}
        messages: list[dict[str, Any]] = [system, user]
        prompt = self.prefix_ids + self.encode(
            f"<|im_start|>user\n{task}<|im_end|>\n<|im_start|>assistant\n"
        )
        calls = []
        clock = started
        for index in range(CALLS):
            if index < len(plan):
                tool, argument, value, thought = plan[index]
                arguments = orjson.dumps({argument: value}).decode()
                call_id = self.hex_id("call", 24)
                reply: dict[str, Any] = {
                    "role": "assistant",
                    "content": thought,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": tool, "arguments": arguments},
                        }
                    ],
                }
                text = (
                    f"{thought}\n<tool_call>\n"
                    f'{{"name": "{tool}", "arguments": {arguments}}}\n</tool_call>'
                )
                finish = "tool_calls"
            else:
                text = (
                    f"Order {order} ({item}) is {'refunded' if reward > 0.5 else 'checked'}: "
                    "you get an email within the hour."
                )
                reply, finish = {"role": "assistant", "content": text}, "stop"
            completion = [*self.encode(text), 2]  # <|im_end|>
            latency = rng.uniform(0.4, 2.5)
            calls.append(
                {
                    "id": self.hex_id("call"),
                    "rollout_id": rollout_id,
                    "index": index,
                    "choice_index": 0,
                    "model": NAME,
                    "adapter_step": step,
                    "replica": None,
                    "api": "chat.completions",
                    "messages": list(messages),
                    "tools": self.tools,
                    "request_params": {"model": NAME, "max_tokens": 256, "temperature": 1.0},
                    "prompt_token_ids": prompt,
                    "completion_token_ids": completion,
                    "logprobs": self.logprobs(len(completion)),
                    "completion_text": text + "<|im_end|>",
                    "response_message": reply,
                    "finish_reason": finish,
                    "created_at": clock,
                    "latency_s": latency,
                    "metadata": {"turn": index, "tool_call_parser": "hermes"},
                }
            )
            clock += latency
            if finish != "tool_calls":
                break
            status = rng.choice(["delivered", "in transit", "returned", "refund approved"])
            result = orjson.dumps(
                {
                    "status": status,
                    "total": round(rng.uniform(20, 900), 2),
                }
            ).decode()
            messages = [
                *messages,
                reply,
                {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": result},
            ]
            prompt = (
                prompt
                + completion
                + self.encode(
                    f"\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>"
                    "\n<|im_start|>assistant\n"
                )
            )
        return {
            "id": rollout_id,
            "calls": calls,
            "messages_and_choices": [],
            "tools": self.tools,
            "additional_histories": [],
            "reward": reward,
            "metrics": {"turns": len(calls), "tool_calls": len(calls) - 1, "tool_errors": 0},
            "metadata": {
                "scenario_id": scenario,
                "task": task,
                "split": split,
                "step": step,
                "stop_reason": "answered",
                "tools_used": [p[0] for p in plan],
            },
            "logs": [],
            "start_time": started,
            "end_time": clock,
        }

    def task(self, number: int) -> tuple[str, str]:
        rng = random.Random(number)
        item, city, issue = rng.choice(ITEMS), rng.choice(CITIES), rng.choice(ISSUES)
        text = f"Hi, my {item} order to {city} {issue}. Can you sort it out? (case {number})"
        return f"scn_{number:05d}", text

    def step(self, split: str, step: int, groups: int, size: int, started: float) -> dict:
        """Write one step's trajectories (and its training signal when ``split`` trains)."""
        lines, signal, rewards_all, trained_tokens = [], [], [], 0
        skipped = 0
        for group in range(groups):
            scenario, task = self.task(group if split == "val" else (step * groups + group) % 400)
            skill = min(0.9, 0.15 + step / 120)
            if self.rng.random() < 0.06:  # all equal: GRPO learns nothing from it
                rewards = [float(self.rng.random() < skill)] * size
            else:
                rewards = [
                    round(min(1.0, max(0.0, skill + self.rng.gauss(0, 0.3))), 2)
                    for _ in range(size)
                ]
                rewards[0], rewards[1] = 0.0, 1.0  # never all equal
            trajectories = [
                self.rollout(split, step, scenario, task, reward, started + i)
                for i, reward in enumerate(rewards)
            ]
            rewards_all += rewards
            lines.append(
                orjson.dumps(
                    {
                        "trajectories": trajectories,
                        "exceptions": [],
                        "metadata": {"scenario_key": scenario},
                        "metrics": {},
                        "logs": [],
                    }
                )
            )
            if split != "train":
                continue
            if max(rewards) - min(rewards) <= 1e-9:
                skipped += 1
                continue
            mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
            for trajectory, reward in zip(trajectories, rewards, strict=True):
                sampler = [lp for call in trajectory["calls"] for lp in call["logprobs"]]
                trained_tokens += len(sampler)
                signal.append(
                    {
                        "trajectory_id": trajectory["id"],
                        "advantage": (reward - mean) / (std + 1e-6),
                        "token_weight": 0.0,  # set below: 1 / (tokens x rollouts trained)
                        "sequences": [
                            {
                                "call_ids": [call["id"] for call in trajectory["calls"]],
                                "trained_tokens": len(sampler),
                                "trainer_logprobs": [
                                    float(f"{lp + self.rng.gauss(0, 0.02):.6g}") for lp in sampler
                                ],
                            }
                        ],
                    }
                )
        path = self.folder / "trajectories" / split / f"{step:04d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\n".join(lines) + b"\n")
        if signal:
            for record in signal:
                tokens = record["sequences"][0]["trained_tokens"]
                record["token_weight"] = 1.0 / (tokens * len(signal))
            signal_path = self.folder / "signals" / split / f"{step:04d}.jsonl"
            signal_path.parent.mkdir(parents=True, exist_ok=True)
            signal_path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in signal))
        return {
            "rewards": rewards_all,
            "skipped": skipped,
            "trained": len(signal),
            "trained_tokens": trained_tokens,
        }

    def checkpoint(self, step: int) -> None:
        """A checkpoint folder as the viewer sees it (it only lists them; no weights here)."""
        folder = self.folder / "checkpoints" / f"{step:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 16}')
        (folder / "adapter_model.safetensors").write_bytes((8).to_bytes(8, "little") + b"{}      ")
        state = {"format_version": 1, "step": step, "base_model": str(self.base_model)}
        (folder / "trainer_state.json").write_text(orjson.dumps(state).decode())

    def write(self, steps: int, rollouts: int) -> None:
        groups = rollouts // GROUP_SIZE
        self.folder.mkdir(parents=True, exist_ok=True)
        info = {"name": NAME, "project": PROJECT, "config": None, "base_model": "tiny-random"}
        (self.folder / "model.json").write_text(orjson.dumps(info).decode())
        history = []
        clock = 1_760_000_000.0
        for step in range(steps + 1):
            if step % VAL_EVERY == 0 or step == steps:
                val = self.step("val", step, groups, 2, clock)
                history.append(
                    {
                        "step": step,
                        "split": "val",
                        "time": clock,
                        "val/num_trajectories": len(val["rewards"]),
                        "val/reward": statistics.fmean(val["rewards"]),
                    }
                )
            if step == steps:
                break
            done = self.step("train", step, groups, GROUP_SIZE, clock)
            train_s = self.rng.uniform(20, 40)
            clock += self.rng.uniform(60, 120) + train_s
            self.checkpoint(step + 1)
            history.append(self.train_record(step, clock, train_s, groups, done))
        with (self.folder / "history.jsonl").open("wb") as file:
            for record in history:
                file.write(orjson.dumps(record) + b"\n")

    def train_record(
        self, step: int, clock: float, seconds: float, groups: int, done: dict[str, Any]
    ) -> dict[str, Any]:
        """The history record of a train step, with the keys a real one has."""
        rng, rewards = self.rng, done["rewards"]
        rollouts = len(rewards)
        mean = statistics.fmean(rewards)
        loss = rng.gauss(0, 0.02)
        return {
            "step": step,
            "split": "train",
            "time": clock,
            "checkpoint_step": step + 1,
            "train/turns": float(CALLS),
            "train/tool_calls": float(CALLS - 1),
            "train/tool_errors": 0.0,
            "train/tool_timeouts": 0.0,
            "train/truncated_results": 0.0,
            "train/completed": mean,
            "train/sampling_groups_with_signal": float(groups - done["skipped"]),
            "train/sampling_groups_all_equal": float(done["skipped"]),
            "train/sampling_groups_dropped": 0.0,
            "train/sampling_groups_grown": 0.0,
            "train/sampling_rollouts": float(rollouts),
            "train/sampling_rollouts_all_equal": float(done["skipped"] * GROUP_SIZE),
            "train/sampling_rollouts_added": 0.0,
            "train/sampling_reward": mean,
            "train/scenarios_tried": float(groups * (step + 1)),
            "train/scenarios_never_solved": max(0.0, 0.5 - step / 200),
            "train/scenarios_always_solved": min(0.5, step / 200),
            "train/scenarios_learning": 0.5,
            "train/reward": mean,
            "train/reward_std": statistics.pstdev(rewards),
            "train/num_groups": float(groups),
            "train/num_trajectories": float(rollouts),
            "train/num_exceptions": 0.0,
            "train/groups_skipped": float(done["skipped"]),
            "train/trajectories_without_calls": 0.0,
            "train/num_rollouts_trained": float(done["trained"]),
            "train/num_sequences": float(done["trained"]),
            "train/sequence_breaks": 0.0,
            "train/num_trainable_tokens": float(done["trained_tokens"]),
            "train/loss": loss,
            "train/policy_loss": loss,
            "train/clip_fraction": rng.uniform(0, 0.02),
            "train/ratio": 1.0 + rng.gauss(0, 0.002),
            "train/logprob_mismatch": abs(rng.gauss(0, 0.01)),
            "train/entropy": max(0.1, 1.2 - step / 150 + rng.gauss(0, 0.03)),
            "train/grad_norm": abs(rng.gauss(0.3, 0.1)),
            "train/optimizer_steps": 1.0,
            "train/skipped_updates": 0.0,
            "train/num_micro_batches": float(max(1, done["trained"] // 4)),
            "train/learning_rate": 1e-5,
            "train/seconds": seconds,
            "train/tokens_per_second": done["trained_tokens"] * 30 / seconds,
            "train/trained": 1.0,
        }


def model_folder(art: Path) -> Path:
    return art / PROJECT / "models" / NAME


def folder_sizes(folder: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for root, _dirs, files in os.walk(folder):
        part = Path(root).relative_to(folder).parts
        key = part[0] if part else "."
        for name in files:
            sizes[key] = sizes.get(key, 0) + (Path(root) / name).stat().st_size
    return sizes


def prepare(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """The art folder (written unless ``--path`` holds one already) and a temp dir to remove."""
    from tokenizers import Tokenizer

    from art_core.embedded import resolve_base_model

    temp = None
    art = Path(args.path) if args.path else Path(tempfile.mkdtemp(prefix="art-ui-bench-"))
    if not args.path:
        temp = art
    folder = model_folder(art)
    if (folder / "model.json").is_file():
        print(f"reusing the folder at {art} (--steps and --rollouts are what it holds)")
    else:
        base = resolve_base_model("tiny-random", art)
        tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
        started = time.perf_counter()
        writer = Writer(art, tokenizer, base)
        writer.write(args.steps, args.rollouts)
        print(
            f"wrote {args.steps} train steps x {args.rollouts} rollouts in "
            f"{time.perf_counter() - started:.1f} s (tokenizer: tiny-random, "
            f"{writer.vocab} ids)"
        )
    return art, temp


def describe(art: Path) -> tuple[list[int], list[str]]:
    """The train steps of the folder and the rollout ids of its first step, printed."""
    folder = model_folder(art)
    steps = sorted(int(p.stem) for p in (folder / "trajectories" / "train").glob("*.jsonl"))
    first = (folder / "trajectories" / "train" / f"{steps[0]:04d}.jsonl").read_bytes()
    groups = [orjson.loads(line) for line in first.splitlines() if line.strip()]
    ids = [t["id"] for g in groups for t in g["trajectories"]]
    calls = [c for g in groups for t in g["trajectories"] for c in t["calls"]]
    prompts = [
        statistics.fmean(len(c["prompt_token_ids"]) for c in calls if c["index"] == turn)
        for turn in range(CALLS)
    ]
    completion = statistics.fmean(len(c["completion_token_ids"]) for c in calls)
    sizes = folder_sizes(folder)
    mib = sum(sizes.values()) / 2**20
    parts = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sorted(sizes.items()) if k != ".")
    print(
        f"folder {folder}: {mib:.0f} MiB ({parts}); {len(steps)} train steps x {len(ids)} "
        f"rollouts x {len(calls) // max(1, len(ids))} calls, prompts of "
        f"{' -> '.join(f'{p:.0f}' for p in prompts)} tokens (call 1 -> {CALLS}), completions "
        f"of {completion:.0f} tokens a call on average; one step file "
        f"{len(first) / 2**20:.1f} MiB"
    )
    print(
        "no calls.sqlite is written: the viewer never reads it (everything it shows comes "
        "from model.json, history.jsonl, trajectories/, signals/ and checkpoints/)"
    )
    return steps, ids


# ---------------------------------------------------------------------------- timing
def start_viewer(art: Path) -> tuple[subprocess.Popen[str], str]:
    """``art-core ui`` on a free loopback port (its process group stopped with us)."""
    process = spawn(
        [sys.executable, "-m", "art_core.cli", "ui", str(art), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    return process, wait_for_url(process, "art-core ui", 120).rstrip("/")


class Pages:
    """The URLs of the three pages and timed GETs of them."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.sizes: dict[str, int] = {}
        self.replies: dict[str, Any] = {}

    def get(self, kind: str, paths: list[str]) -> float:
        started = time.perf_counter()
        for path in paths:
            response = self.client.get(path)
            if response.status_code != 200:
                raise RuntimeError(f"GET {path}: {response.status_code} {response.text[:300]}")
            if path.startswith("/api/"):
                self.sizes[kind] = len(response.content)
                self.replies[kind] = response
        return (time.perf_counter() - started) * 1000

    def run(self) -> float:
        return self.get("run", [f"/run/{PROJECT}/{NAME}", f"/api/runs/{PROJECT}/{NAME}"])

    def step(self, step: int) -> float:
        return self.get("step", [f"/api/runs/{PROJECT}/{NAME}/steps/train/{step}"])

    def rollout(self, step: int, rollout: str) -> float:
        return self.get(
            "rollout",
            [
                f"/rollout/{PROJECT}/{NAME}/train/{step}/{rollout}",
                f"/api/runs/{PROJECT}/{NAME}/steps/train/{step}/rollouts/{rollout}",
            ],
        )


def rollout_ids(art: Path, step: int) -> list[str]:
    path = model_folder(art) / "trajectories" / "train" / f"{step:04d}.jsonl"
    return [
        t["id"]
        for line in path.read_bytes().splitlines()
        for t in orjson.loads(line)["trajectories"]
    ]


def check_replies(pages: Pages) -> None:
    """The replies timed are the pages' real ones: curves drawn, tokens with their signal."""
    run = pages.replies["run"].json()
    if not run["curves"] or run["summary"]["problems"]:
        raise RuntimeError(f"the run page has no curves or problems: {run['summary']}")
    tokens = pages.replies["rollout"].json()["tokens"]
    if not tokens.get("available") or tokens.get("sequence_breaks"):
        raise RuntimeError(f"the rollout's token view is not one merged sequence: {tokens}")
    if not str(tokens.get("tokenizer", "")).endswith("tokenizer.json"):
        raise RuntimeError(f"the viewer found no tokenizer: {tokens.get('tokenizer')}")


class BrowserUnavailable(RuntimeError):
    """The browser could not be started (the column is skipped, with this reason)."""


def browser_unavailable() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"no {CHROMIUM}"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"playwright does not import ({exc})"
    return None


# Set in the page before its own script runs: when each watched element first exists, and
# the page's clock once the frame that shows it is drawn (ms since the navigation started).
DRAWN_SCRIPT = """
(() => {
  const watched = ["#charts .chart svg", "#token-view"], seen = {};
  window.__drawn = {};
  window.__built = {};
  new MutationObserver(() => {
    for (const selector of watched) {
      if (!seen[selector] && document.querySelector(selector)) {
        seen[selector] = true;
        window.__built[selector] = performance.now();
        requestAnimationFrame(() => setTimeout(() => {
          window.__drawn[selector] = performance.now();
        }, 0));
      }
    }
  }).observe(document, {childList: true, subtree: true});
})();
"""
RUN_DRAWN, ROLLOUT_DRAWN = "#charts .chart svg", "#token-view"
# Where the page's time went (its clock, ms from the navigation's start).
PHASES_SCRIPT = """
(selector) => {
  const navigation = performance.getEntriesByType("navigation")[0];
  const api = performance.getEntriesByType("resource").find(r => r.name.includes("/api/"));
  return {
    "HTML received": navigation.responseEnd,
    "scripts run (DOMContentLoaded)": navigation.domContentLoadedEventEnd,
    "API asked": api ? api.startTime : null,
    "API replied": api ? api.responseEnd : null,
    "element built": window.__built[selector],
    "drawn": window.__drawn[selector],
  };
}
"""


def browser_times(
    url: str, repeats: int, run_page: str, rollouts: list[str], cold_rollouts: list[str]
) -> dict[str, dict[str, list[float]]]:
    """Headless chromium, per page: ``page`` (the page's own clock from the navigation's start
    until the frame showing the element is drawn), the phases before it (``PHASES_SCRIPT``)
    and ``wall`` (playwright's ``goto`` until ``wait_for_selector`` returns here: adds the
    driver's round trips)."""
    from playwright.sync_api import sync_playwright

    kinds = ("run", "rollout", "rollout cold")
    times: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}
    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Exception as exc:  # e.g. a chromium that cannot start here: no column
            raise BrowserUnavailable(f"{CHROMIUM} does not start: {exc}") from exc
        try:
            context = browser.new_context()
            context.add_init_script(DRAWN_SCRIPT)
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))

            def navigate(kind: str | None, path: str, selector: str) -> None:
                started = time.perf_counter()
                page.goto(url + path, wait_until="commit")
                page.wait_for_selector(selector, state="attached", timeout=60_000)
                wall = (time.perf_counter() - started) * 1000
                page.wait_for_function("s => window.__drawn[s]", arg=selector, timeout=60_000)
                phases = page.evaluate(PHASES_SCRIPT, selector)
                if page.query_selector("#page-error") or errors:
                    raise RuntimeError(f"{path}: the page failed: {errors}")
                if kind is not None:
                    for phase, value in [*phases.items(), ("wall", wall)]:
                        if value is not None:
                            times[kind].setdefault(phase, []).append(float(value))

            navigate(None, run_page, RUN_DRAWN)  # the browser's own first start
            for path in cold_rollouts:
                navigate("rollout cold", path, ROLLOUT_DRAWN)
            for _ in range(repeats):
                navigate("run", run_page, RUN_DRAWN)
            for number in range(repeats):
                navigate("rollout", rollouts[number % len(rollouts)], ROLLOUT_DRAWN)
        finally:
            browser.close()
    return times


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def server_rss(pid: int) -> str:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return f"{int(line.split()[1]) / 1024:.0f} MiB"
    except (OSError, ValueError):
        pass
    return "?"


def http_times(
    url: str,
    art: Path,
    step_cold: list[int],
    rollout_cold: list[int],
    repeats: int,
    pick: random.Random,
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[int, list[str]], dict[str, int]]:
    """Seconds per page over HTTP, cold (the first request for each step) and warm (pages
    opened again), the rollouts opened on each step, and the API replies' sizes."""
    with httpx.Client(base_url=url, timeout=120) as client:
        pages = Pages(client)
        cold: dict[str, list[float]] = {"run": [pages.run()], "step": [], "rollout": []}
        for step in step_cold:
            cold["step"].append(pages.step(step))
        opened = {}
        for step in rollout_cold:
            opened[step] = rollout_ids(art, step)
            cold["rollout"].append(pages.rollout(step, pick.choice(opened[step])))
        check_replies(pages)
        warm: dict[str, list[float]] = {"run": [], "step": [], "rollout": []}
        for number in range(repeats):
            warm["run"].append(pages.run())
            warm["step"].append(pages.step(step_cold[number % len(step_cold)]))
            step = rollout_cold[number % len(rollout_cold)]
            warm["rollout"].append(pages.rollout(step, pick.choice(opened[step])))
        check_replies(pages)
    return cold, warm, opened, pages.sizes


def measure(art: Path, steps: list[int], repeats: int, browser: bool) -> None:
    shuffled = random.Random(1).sample(steps, len(steps))
    cold_count = max(1, min(5, len(steps) // 3))
    step_cold = shuffled[:cold_count]
    rollout_cold = shuffled[cold_count : 2 * cold_count]
    browser_cold = shuffled[2 * cold_count : 3 * cold_count]
    pick = random.Random(2)
    reason = None if browser else "--no-browser"
    reason = reason or browser_unavailable()
    in_browser: dict[str, dict[str, list[float]]] = {}
    process, url = start_viewer(art)
    try:
        rss_started = server_rss(process.pid)
        cold, warm, opened, sizes = http_times(url, art, step_cold, rollout_cold, repeats, pick)
        if reason is None:
            model = f"{PROJECT}/{NAME}"
            warm_paths = [
                f"/rollout/{model}/train/{s}/{pick.choice(opened[s])}" for s in rollout_cold
            ]
            cold_paths = [
                f"/rollout/{model}/train/{s}/{pick.choice(rollout_ids(art, s))}"
                for s in browser_cold
            ]
            try:
                in_browser = browser_times(url, repeats, f"/run/{model}", warm_paths, cold_paths)
            except BrowserUnavailable as exc:
                reason = str(exc).splitlines()[0]
        rss = server_rss(process.pid)
    finally:
        stop(process, grace_s=5)

    def shown(kind: str, what: str = "drawn") -> float | None:
        return median(in_browser[kind][what]) if in_browser else None

    rows = [
        ("run page (HTML + run API)", "run", cold["run"], warm["run"], shown("run")),
        ("step page (step API)", "step", cold["step"], warm["step"], None),
        (
            "rollout page (HTML + rollout API)",
            "rollout",
            cold["rollout"],
            warm["rollout"],
            shown("rollout"),
        ),
        (
            "rollout page, direct link to a step not opened",
            "rollout",
            cold["rollout"],
            [],
            shown("rollout cold"),
        ),
    ]
    print(
        f"\nart-core ui (a child process) over HTTP on loopback: cold = first request after "
        f"start (step and rollout pages: median over {cold_count} steps not opened before), "
        f"warm = median of {repeats}; browser = headless chromium, navigation until drawn, "
        f"median of {repeats if in_browser else 0}"
    )
    print("| page | cold ms | warm ms (median) | browser ms | goal ms | goal / ours |")
    print("|---|---|---|---|---|---|")
    for label, kind, cold_ms, warm_ms, browser_ms in rows:
        values = [median(cold_ms), median(warm_ms), browser_ms]
        goal = GOALS_MS.get(kind)
        slowest = max(v for v in values if v is not None)
        ratio = f"{goal / slowest:.1f}" if goal else "-"
        print(f"| {label} | {' | '.join(cell(v) for v in values)} | {cell(goal)} | {ratio} |")
    print(
        f"\ngoal / ours: the goal over the slowest of the row's columns. First request of each "
        f"kind after start: run {cold['run'][0]:.0f} ms, step {cold['step'][0]:.0f} ms, "
        f"rollout {cold['rollout'][0]:.0f} ms (also loads the tokenizer); cold rollouts "
        f"{', '.join(f'{v:.0f}' for v in cold['rollout'])} ms"
    )
    print(
        "reply sizes: "
        + ", ".join(f"{kind} API {size / 1024:.0f} KiB" for kind, size in sizes.items())
        + f"; server RSS {rss_started} at start, {rss} after every request"
    )
    if in_browser:
        print(
            "browser ms: the page's own clock from the navigation's start to the frame that "
            "shows the run page's first chart / the rollout's token view (playwright's wall "
            "clock around it adds its driver's round trips). In the page, median ms from the "
            "navigation's start:"
        )
        for kind, phases in in_browser.items():
            print(f"  {kind}: " + ", ".join(f"{k} {cell(median(v))}" for k, v in phases.items()))
    else:
        print(f"browser column skipped: {reason}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rollouts", type=int, default=64, help="per step (groups of 8)")
    parser.add_argument("--repeats", type=int, default=20, help="warm requests per page")
    parser.add_argument("--path", default=None, help="write the folder here (or reuse it)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--no-browser", action="store_true", help="skip the browser column")
    parser.add_argument("--smoke", action="store_true", help="3 steps x 8 rollouts, 3 repeats")
    args = parser.parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it
    if args.smoke:
        args.steps, args.rollouts, args.repeats = 3, GROUP_SIZE, 3
    if args.rollouts % GROUP_SIZE or args.rollouts <= 0 or args.steps < 1:
        parser.error(f"--rollouts must be a multiple of {GROUP_SIZE}, --steps at least 1")
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    art, temp = prepare(args)
    try:
        steps, _ids = describe(art)
        measure(art, steps, args.repeats, browser=not args.no_browser)
    finally:
        if temp is not None and not args.keep:
            shutil.rmtree(temp, ignore_errors=True)
        elif temp is not None:
            print(f"kept {temp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
