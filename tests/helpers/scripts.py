"""scripts/<folder>/<name>.py imported as a module, for tests of a study's or benchmark's own functions.

The scripts are a package run from the repository root (``python -m scripts.studies.<name>``); the
tests' root on sys.path lets their own ``scripts.*`` imports resolve the same way here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str):
    """The module of ``scripts/<name>.py`` (``name`` as ``folder/stem``), executed once per call."""
    spec = importlib.util.spec_from_file_location("scripts." + name.replace("/", "."), SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
