"""The wire APIs the gateway speaks besides chat completions, one module each.

Each turns its request into the gateway's one internal conversation (a chat request: one
chat template, one prompt builder, one grammar path, one record) at its edge, and the
sampled answer back into its own response shape and stream events (``edge`` holds what they
share; ``deltas`` the streamed text).
"""
