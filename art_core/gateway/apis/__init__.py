"""The wire APIs the gateway speaks, one module each: ``chat`` (Chat Completions),
``responses`` (OpenAI Responses), ``messages`` (Anthropic Messages), ``completions``
(legacy Completions), and ``models`` (the model list, health, a rollout's sampling).

Each is a peer over the gateway's one core: it translates its request to the internal chat
request at its edge (``reading``), and the recorded calls back into its own response shape
and stream events (an encoder for ``answering.stream_answer``). A module's ``ROUTES`` is all
``app.Gateway`` needs to serve it.
"""
