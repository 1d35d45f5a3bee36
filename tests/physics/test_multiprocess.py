"""Two processes on one machine (gloo collectives, 2 CPU devices each) = one 4-device run."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def forward_density(pdims):
    """The forward model used on both sides of the comparison: 2LPT + 4 PM steps."""
    from fli.cosmology import planck18
    from fli.grid import Grid
    from fli.nbody import density, simulate
    from fli.sharding import make_mesh, white_noise

    grid = Grid((16, 16, 24), (320.0, 320.0, 480.0), make_mesh(pdims), halo=2)
    s = white_noise(3, grid.shape, grid.mesh)
    f = jax.jit(lambda c, s: density(simulate(c, s, grid, np.linspace(0.1, 1.0, 5))[0].disp, grid))
    return f(planck18(), s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv_for, n=2, timeout=600, cwd=ROOT):
    """Start n processes with argv_for(pid) in cwd; return their (rc, output)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS="")
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


@pytest.mark.multiprocess
def test_two_processes_reproduce_four_devices(tmp_path):
    port, out = free_port(), tmp_path / "rho.npy"
    worker = str(ROOT / "tests" / "mp_forward_worker.py")
    res = launch(lambda i: [sys.executable, worker, str(port), "2", str(i), str(out)])
    for rc, text in res:
        assert rc == 0, text[-3000:]
        assert "2 processes, 4 devices" in text
    ref = np.asarray(forward_density((2, 2)))
    # same program, same layout, gloo vs in-process collectives: float32 rounding only
    np.testing.assert_allclose(np.load(out), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
