"""verifiers' own ``ReasoningGymEnv`` (``verifiers.envs.integrations.reasoninggym_env``),
loaded by id the way ``vf.load_environment`` loads an installed environment module.

The environment is the verifiers authors' code, unchanged: a single-turn chat task from a
reasoning-gym generator, the answer parsed from ``<answer>...</answer>`` by its ``XMLParser``
and scored by the generator's own ``score_answer``. This module only exposes it under an id
(it is not published as an installable environment); the runtime needs ``reasoning-gym``
(``learning_suite.py`` installs it into the verifiers venv).
"""

from __future__ import annotations

from typing import Any

import verifiers as vf


def load_environment(**kwargs: Any) -> Any:
    """``vf.ReasoningGymEnv(**kwargs)``: ``gym`` (a generator name, or a list of
    ``{"name", "weight", "config"}`` specs), ``num_train_examples``, ``num_eval_examples``,
    ``seed``."""
    return vf.ReasoningGymEnv(**kwargs)
