"""Gateway: the OpenAI-compatible HTTP front that records every call."""
