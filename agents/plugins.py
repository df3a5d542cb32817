"""Plug-ins named by import path: a researcher's own class, loaded without editing this project.

    cls = load_class("my_package.my_crs:MyCRS")      # or "path/to/file.py:MyCRS"
    record = describe("my_package.my_crs:MyCRS")     # {"target", "source", "sha256"}: provenance + fingerprint

A target is ``package.module:Class`` (imported from the Python path, the working directory first) or
``path/to/file.py:Class`` (loaded from that file, its folder put on the Python path so that it imports
the files beside it; a file that fails halfway is not kept as a module). Each simulator documents the small protocol its
plug-ins follow; this module only finds the class and says which code it was, so a run that used a
plug-in records the file's digest and refuses to resume after the plug-in's code changed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path

TARGET = re.compile(r"^(?P<module>[^:]+):(?P<name>[A-Za-z_][A-Za-z0-9_]*)$")


class PluginError(ValueError):
    """A plug-in that cannot be loaded: the message names the target and what is wrong."""


def is_target(text: str) -> bool:
    """Whether a config value names a plug-in (``module:Class``) rather than a built-in."""
    return bool(TARGET.match(text)) and "://" not in text


def load_class(target: str) -> type:
    match = TARGET.match(target)
    if not match:
        raise PluginError(f"plug-in {target!r}: expected package.module:Class or path/to/file.py:Class")
    module_name, name = match["module"], match["name"]
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).resolve()
            if not path.is_file():
                raise PluginError(f"plug-in {target!r}: no file {path}")
            key = f"plugin_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
            module = sys.modules.get(key)
            if module is None:
                # the file's own folder first, as `python file.py` would: a plug-in split into several
                # files imports its neighbours
                if str(path.parent) not in sys.path:
                    sys.path.insert(0, str(path.parent))
                spec = importlib.util.spec_from_file_location(key, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[key] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:  # half a module is not kept: the next load tries the file again
                    del sys.modules[key]
                    raise
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))  # as `python -m` would: the working directory's packages
            module = importlib.import_module(module_name)
    except PluginError:
        raise
    except Exception as error:  # an import error in the researcher's module: say which and why
        raise PluginError(f"plug-in {target!r}: cannot import {module_name}: {error!r}") from error
    cls = getattr(module, name, None)
    if not inspect.isclass(cls):
        raise PluginError(f"plug-in {target!r}: {module_name} has no class {name}")
    return cls


def describe(target: str) -> dict:
    """The plug-in's target, source file and the file's sha256 (for provenance and fingerprints)."""
    cls = load_class(target)
    try:
        source = Path(inspect.getsourcefile(cls) or "")
    except TypeError:  # a built-in or C class: no source file
        source = Path()
    digest = hashlib.sha256(source.read_bytes()).hexdigest() if source.is_file() else None
    return {"target": target, "source": str(source) if digest else None, "sha256": digest}
