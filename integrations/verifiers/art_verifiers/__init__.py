"""art_verifiers: run verifiers environments, unchanged, as art-core rollouts.

A verifiers environment (``vf.load_environment(...)``: a dataset, a parser, a rubric; see
https://github.com/PrimeIntellect-ai/verifiers) runs in its own venv (verifiers' pins clash
with the core's) with one OpenAI client per rollout, pointed at that rollout's base URL on the
gateway, so every call is recorded token-exactly; its rubric's rewards come back and each
rollout becomes an ``art.Trajectory``, grouped per dataset example, ready for ``model.train``.

Example:
    >>> import art_verifiers
    >>> env = art_verifiers.VerifiersEnv("reverse_text")
    >>> groups = await art_verifiers.rollout_groups(model, env, range(8))  # needs a registered model, and the verifiers venv (an install)  # doctest: +SKIP
    >>> await model.train(groups)  # needs a registered model  # doctest: +SKIP
"""

from art_verifiers.rollout import VerifiersEnv, VerifiersError, rollout_groups, to_trajectory
from art_verifiers.runtime import PINS, install_runtime, is_installed, runtime_dir, runtime_python

__all__ = [
    "PINS",
    "VerifiersEnv",
    "VerifiersError",
    "install_runtime",
    "is_installed",
    "rollout_groups",
    "runtime_dir",
    "runtime_python",
    "to_trajectory",
]
