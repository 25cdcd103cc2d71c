"""A multi-turn verifiers environment with a tool, as verifiers' documentation shows one: a
``vf.ToolEnv`` whose tool is a plain Python function (its schema comes from the signature and
docstring), a dataset built in memory (offline) and a rubric checking the final answer."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

PAIRS = [(2, 3), (10, 7), (41, 1)]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def load_environment(**kwargs) -> vf.Environment:
    dataset = Dataset.from_list(
        [
            {"question": f"What is {a} + {b}? Use the add tool.", "answer": str(a + b)}
            for a, b in PAIRS
        ]
    )
    parser = vf.Parser()

    def correct(completion, answer, **kwargs) -> float:
        return 1.0 if answer in (parser.parse_answer(completion) or "") else 0.0

    rubric = vf.Rubric(funcs=[correct], parser=parser)
    return vf.ToolEnv(
        dataset=dataset, tools=[add], max_turns=3, parser=parser, rubric=rubric, **kwargs
    )
