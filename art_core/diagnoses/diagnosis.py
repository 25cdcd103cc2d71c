"""``Diagnosis``: one reason a step learned little or nothing, with its evidence and the setting
that would change it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Diagnosis(BaseModel):
    """One rule that fired on a step's records.

    ``code`` names the rule (``art_core.diagnoses.rules``), ``finding`` says what the records
    show (with counts), ``setting`` names what to change, ``share`` is the measured share
    (of rollouts, groups or tool calls: ``unit``) and ``threshold`` the share at which the
    rule fires.

    Example:
        >>> d = Diagnosis(code="truncated", finding="12 of 16 runs cut by max_tokens (256)",
        ...               setting="max_tokens: raise it", share=0.75, threshold=0.2,
        ...               unit="rollouts")
        >>> d.line()
        'truncated: 12 of 16 runs cut by max_tokens (256) -> max_tokens: raise it'
    """

    model_config = ConfigDict(extra="forbid")

    code: str
    finding: str
    setting: str
    share: float = Field(ge=0.0)
    threshold: float = Field(ge=0.0)
    unit: str = "rollouts"

    def line(self) -> str:
        """``code: finding -> setting``: one line for progress output and logs."""
        return f"{self.code}: {self.finding} -> {self.setting}"
