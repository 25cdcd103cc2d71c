"""``art-core serve``: a ``LocalBackend`` as an HTTP service for ``RemoteBackend``.

``settings`` (``ServeSettings``), ``auth`` (bearer tokens), ``limits`` (413 / 429),
``schemas`` (validated request bodies), ``jobs`` (training as server-side tasks),
``registry`` (models to load again after a restart), ``service`` (the state), ``api`` (the
``/api`` routes), ``app`` (the ASGI stack with the gateway mounted), ``cli`` (the command).

Example:
    >>> # art-core serve --host 0.0.0.0 --port 7999 --token "$ART_CORE_TOKEN"
"""

from art_core.server.settings import ServeSettings

__all__ = ["ServeSettings"]
