"""Two processes on one machine (gloo collectives, 2 CPU devices each) = one 4-device run."""

import sys

import numpy as np
import pytest

from tests.helpers.processes import ROOT, forward_density, free_port, launch


@pytest.mark.multiprocess
def test_two_processes_reproduce_four_devices(tmp_path):
    port, out = free_port(), tmp_path / "rho.npy"
    worker = str(ROOT / "tests" / "helpers" / "mp_forward_worker.py")
    res = launch(lambda i: [sys.executable, worker, str(port), "2", str(i), str(out)])
    for rc, text in res:
        assert rc == 0, text[-3000:]
        assert "2 processes, 4 devices" in text
    ref = np.asarray(forward_density((2, 2)))
    # same program, same layout, gloo vs in-process collectives: float32 rounding only
    np.testing.assert_allclose(np.load(out), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
