"""scripts/<name>.py imported as a module, for tests of a study's or benchmark's own functions
(the scripts are not a package: they put scripts/ on sys.path themselves)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str):
    """The module of ``scripts/<name>.py``, executed once per call."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
