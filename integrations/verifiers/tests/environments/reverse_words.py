"""A verifiers environment written the way verifiers' documentation shows one: a module with a
``load_environment()`` returning a ``vf.SingleTurnEnv`` over a dataset, a parser and a rubric.
It runs in the verifiers venv (``art_verifiers`` loads it there with ``vf.load_environment``),
offline: the dataset is built in memory, nothing comes from the Hugging Face hub.

The rubric follows verifiers' own ``reverse_text`` example: the longest-common-subsequence
ratio between the reply and the reversed text (partial credit the environment itself defines),
plus a small exact-match bonus.
"""

from __future__ import annotations

from difflib import SequenceMatcher

import verifiers as vf
from datasets import Dataset

WORDS = ["hello world", "open pipe", "art core", "tiny model", "verify this", "red apple"]


def load_environment(num_examples: int = len(WORDS), **kwargs) -> vf.Environment:
    dataset = Dataset.from_list(
        [
            {"question": f"Reverse the text: {text}", "answer": text[::-1]}
            for text in WORDS[:num_examples]
        ]
    )
    parser = vf.Parser()

    def lcs_reward(completion, answer, **kwargs) -> float:
        response = parser.parse_answer(completion) or ""
        return SequenceMatcher(None, response, answer).ratio()

    def exact_reward(completion, answer, **kwargs) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    rubric = vf.Rubric(funcs=[lcs_reward, exact_reward], weights=[1.0, 0.5], parser=parser)
    return vf.SingleTurnEnv(
        dataset=dataset,
        system_prompt="Reverse the text the user gives, character by character. Reply with the reversed text only.",
        parser=parser,
        rubric=rubric,
        **kwargs,
    )
