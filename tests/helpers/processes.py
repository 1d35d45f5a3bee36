"""Launching worker processes from tests: the repository root, free ports, N processes at once,
and the small PM forward that both sides of the multi-process comparison run."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.helpers import xla

ROOT = Path(__file__).resolve().parents[2]


def forward_density(pdims):
    """The forward model used on both sides of the comparison: 2LPT + 4 PM steps."""
    import jax  # noqa: PLC0415

    from fli.cosmo.background import planck18  # noqa: PLC0415
    from fli.sim.grid import Grid  # noqa: PLC0415
    from fli.sim.nbody import density, simulate  # noqa: PLC0415
    from fli.sim.sharding import make_mesh, white_noise  # noqa: PLC0415

    grid = Grid((16, 16, 24), (320.0, 320.0, 480.0), make_mesh(pdims), halo=2)
    s = white_noise(3, grid.shape, grid.mesh)
    f = jax.jit(lambda c, s: density(simulate(c, s, grid, np.linspace(0.1, 1.0, 5))[0].disp, grid))
    return f(planck18(), s)


def child_env(**extra) -> dict:
    """The environment of a child process of the tests: this one's, with the repository on
    PYTHONPATH and the tests' XLA flags (one CPU device unless the child asks for more), plus
    ``extra``."""
    return dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS=xla.FLAGS, **extra)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv_for, n=2, timeout=600, cwd=ROOT):
    """Start n processes with argv_for(pid) in cwd; return their (rc, output)."""
    env = child_env()
    procs = [subprocess.Popen(argv_for(i), cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(n)]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((p.returncode, out))
    return outs


def run_workers(worker: str, out: Path) -> list[str]:
    """Run ``tests/helpers/<worker>.py PORT 2 PID OUT`` as 2 processes of 2 CPU devices each
    (jax.distributed over gloo); assert that both exited 0 having seen 2 processes and 4
    devices; their outputs. The worker writes its result to ``out`` (process 0)."""
    port, path = free_port(), str(ROOT / "tests" / "helpers" / f"{worker}.py")
    texts = []
    for rc, text in launch(lambda i: [sys.executable, path, str(port), "2", str(i), str(out)]):
        assert rc == 0, text[-3000:]
        assert "2 processes, 4 devices" in text
        texts.append(text)
    return texts
