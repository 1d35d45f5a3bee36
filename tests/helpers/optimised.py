"""Run one function of a test module in a child process that compiles with XLA's default
optimisation, for the few slow tests whose time is spent running their programs rather than
compiling them (tests/helpers/xla.py turns LLVM's optimisation off for everything else).

Measured (docs/benchmarks.md, "Test-suite compile flags"): the PM Wiener recovery test took
201 s compiled optimised and 375 s with ``-O0``, alone one after the other.

``python -m tests.helpers.optimised MODULE:FUNCTION OUT.npz`` calls ``FUNCTION()``, which
returns a dict of arrays, and saves it; the test asserts on what comes back, in its own
process, so a failure reads like any other test's."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.helpers import xla

ROOT = Path(__file__).resolve().parents[2]


def run_optimised(target: str, out: Path, timeout: float = 1200) -> dict[str, np.ndarray]:
    """``target`` is ``"tests.infer.sample.test_x:function"``; return the arrays it computed."""
    flags = os.environ.get("XLA_FLAGS", "").replace(xla.FLAGS, "").strip()
    env = dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS=flags, JAX_NUMPY_RANK_PROMOTION="allow")
    # the same persistent cache as the test session (tests/conftest.py): a second run reuses it
    env.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ.get("FLI_COMPILATION_CACHE", ""))
    p = subprocess.run([sys.executable, "-m", "tests.helpers.optimised", target, str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    with np.load(out) as f:
        return dict(f)


def _main(target: str, out: str) -> None:
    module, name = target.split(":")
    result = getattr(importlib.import_module(module), name)()
    tmp = out + ".part.npz"  # np.savez appends .npz to names without it
    np.savez(tmp, **{k: np.asarray(v) for k, v in result.items()})
    os.replace(tmp, out)


if __name__ == "__main__":
    assert xla.FLAGS not in os.environ.get("XLA_FLAGS", ""), "run through run_optimised"
    _main(*sys.argv[1:3])
