"""Parsing tool-call markup out of model text, at the edges of a cut answer."""

from __future__ import annotations

import json

import pytest

from art_core.chat_formats.hermes import HermesFormat

WHOLE = '{"name": "place_order", "arguments": {"order": {"lines": [{"sku": "pen"}]}}}'


@pytest.mark.parametrize("cut", ["", "\n", "\n<", "\n</tool", "\n</tool_call"])
def test_a_call_cut_in_its_closing_tag_keeps_exactly_its_arguments(cut: str) -> None:
    parsed = HermesFormat().parse(f"<tool_call>\n{WHOLE}{cut}", {"place_order": {}})
    assert parsed.content is None and parsed.truncated
    [call] = parsed.tool_calls
    assert call["function"]["name"] == "place_order"
    assert json.loads(call["function"]["arguments"]) == {"order": {"lines": [{"sku": "pen"}]}}


def test_a_call_cut_in_its_arguments_keeps_the_prefix() -> None:
    parsed = HermesFormat().parse(
        '<tool_call>\n{"name": "f", "arguments": {"x": {"y": 1', {"f": {}}
    )
    [call] = parsed.tool_calls
    assert parsed.truncated and call["function"]["arguments"] == '{"x": {"y": 1'
