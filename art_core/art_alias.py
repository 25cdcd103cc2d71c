"""``import art`` for code written against OpenPipe ART, without shadowing anything.

The name ``art`` is taken twice on PyPI (OpenPipe's ``openpipe-art`` and the ASCII-art
library ``art``), so art-core ships no ``art`` package: installing one would overwrite or hide
theirs. Instead, an opt-in import hook answers ``import art`` only when no other ``art`` can be
imported: ``art-core art-alias install`` writes a ``.pth`` file into this environment's
site-packages that registers ``ArtAliasFinder`` at interpreter start, at the end of
``sys.meta_path`` (every real ``art`` on ``sys.path`` is found before it).

``art`` and ``art.<x>`` are then stand-ins for ``art_core`` and ``art_core.<x>``: their
attributes are art-core's own objects (``art.TrainableModel is art_core.TrainableModel``), and
ART's module paths that art-core lays out differently are mapped (``art.local``,
``art.local.backend``, ``art.utils``, ``art.types``, ``art.backend``). A name art-core does not
have fails as it would in ART, with ``ImportError`` / ``AttributeError``.

This module imports only ``importlib`` when it is loaded (the ``.pth`` runs it at every
interpreter start; art-core is imported on the first ``import art``). The command that
installs it is ``art_core.art_alias_cli``.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types

TYPE_CHECKING = False  # typing is not imported at interpreter start for this
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

MARKER = "__art_core_alias__"

# ART's module paths without an art_core module of the same name: name -> "module:attribute".
ART_PATHS: dict[str, dict[str, str]] = {
    "art.local": {"LocalBackend": "art_core.backends.local:LocalBackend"},
    "art.local.backend": {"LocalBackend": "art_core.backends.local:LocalBackend"},
    "art.backend": {"Backend": "art_core.backends.base:Backend"},
    "art.utils": {"retry": "art_core.retry:retry"},
    "art.types": {
        "Message": "art_core.messages:Message",
        "MessageOrChoice": "art_core.messages:MessageOrChoice",
        "Messages": "art_core.messages:Messages",
        "MessagesAndChoices": "art_core.messages:MessagesAndChoices",
        "Tools": "art_core.messages:Tools",
        "TrainConfig": "art_core.training.config:TrainConfig",
    },
}


def _target(fullname: str) -> str:
    """``art.x.y`` -> ``art_core.x.y``."""
    return "art_core" + fullname[len("art") :]


class _AliasLoader:
    # Duck-typed (importlib.abc costs 8 ms at interpreter start: it imports importlib.resources).
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # a fresh module: art_core's own modules are never renamed

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        if name in ART_PATHS:
            for attribute, where in ART_PATHS[name].items():
                module_name, _, object_name = where.partition(":")
                setattr(
                    module, attribute, getattr(importlib.import_module(module_name), object_name)
                )
        else:
            target = importlib.import_module(_target(name))
            module.__doc__ = target.__doc__
            module.__dict__["__getattr__"] = lambda attribute: getattr(target, attribute)
            module.__dict__["__dir__"] = lambda: dir(target)
        # A package with an empty path: its submodules come from this finder too.
        module.__path__ = []
        setattr(module, MARKER, True)


_LOADER = _AliasLoader()


class ArtAliasFinder:
    """Finds ``art`` / ``art.*`` as stand-ins for art_core, when no real ``art`` exists.

    Example:
        >>> ArtAliasFinder().find_spec("art").name, ArtAliasFinder().find_spec("json")
        ('art', None)
        >>> sys.meta_path.append(ArtAliasFinder())  # what install() does  # changes process-wide state: an import hook  # doctest: +SKIP
    """

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "art" and not fullname.startswith("art."):
            return None
        if fullname != "art":
            parent = sys.modules.get(fullname.rpartition(".")[0])
            if not getattr(parent, MARKER, False):
                return None  # a real `art` was imported: its submodules are its own
            if fullname not in ART_PATHS and importlib.util.find_spec(_target(fullname)) is None:
                return None
        return importlib.machinery.ModuleSpec(fullname, _LOADER, is_package=True)  # type: ignore[arg-type]


def install() -> None:
    """Register the finder (once) at the end of ``sys.meta_path``.

    Example:
        >>> install(); import art  # changes process-wide state: an import hook for every later `import art`  # doctest: +SKIP
    """
    if not any(isinstance(finder, ArtAliasFinder) for finder in sys.meta_path):
        sys.meta_path.append(ArtAliasFinder())
