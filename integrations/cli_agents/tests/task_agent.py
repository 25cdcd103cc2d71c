"""A command-line agent for the training tests: one Chat Completions call to the rollout's
gateway (URL, key and model from its environment, as real agents read them), then the reply
written to ``answer.txt``. What the check makes of that file decides the run's reward, so runs
of one task score differently as the sampled replies differ.

``python task_agent.py`` (no arguments); ``ART_TASK_AGENT_MAX_TOKENS`` caps the reply (8).
"""

from __future__ import annotations

import os

from openai import OpenAI


def main() -> None:
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    reply = client.chat.completions.create(
        model=os.environ["OPENAI_MODEL"],
        messages=[{"role": "user", "content": "Write one word."}],
        # Sampled, not greedy: the runs of a group must be able to differ.
        temperature=1.0,
        max_tokens=int(os.environ.get("ART_TASK_AGENT_MAX_TOKENS", "8")),
    )
    with open("answer.txt", "w", encoding="utf-8") as f:
        f.write(reply.choices[0].message.content or "")


if __name__ == "__main__":
    main()
