"""Helpers for testing code built on art_core, shipped with the package so integrations and
users can test offline too.

- ``pytest_plugin``: session fixtures (a gateway with ``tiny-random``, a stand-in judge), the
  shared models folder, the ``slow`` marker: ``-p art_core.testing.pytest_plugin``;
- ``checks``: ``assert_token_exact``, ``assert_prefix_chain``;
- ``judge``: ``StandInJudge``, an OpenAI-compatible judge on loopback (RULER, generators);
- ``standins``: loopback stand-ins of OTLP, Langfuse and Weave;
- ``loopback``: ``LoopbackServer``, the real HTTP server under every stand-in;
- ``tools``: tool definitions whose calls a random model can make (``WEATHER_TOOL``);
- ``fine_tuned``: ``fine_tuned_stand_in``, tiny-random fine-tuned to answer in a format (a
  game's moves, short sentences / JSON / tool calls) for tests that need one.

Nothing here is imported by ``art_core`` itself.
"""
