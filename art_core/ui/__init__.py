"""``art-core ui``: a local, read-only viewer of an art folder's runs, steps, rollouts and the
token-level training signal (see ``app``). Its scripts and styles ship in the package."""

from art_core.ui.app import build_ui_app
from art_core.ui.auth import BrowserTokenAuth

__all__ = ["BrowserTokenAuth", "build_ui_app"]
