"""Two processes on one machine (gloo collectives, 2 CPU devices each) = one 4-device run."""

import numpy as np
import pytest

from tests.helpers.processes import forward_density, run_workers


@pytest.mark.multiprocess
def test_two_processes_reproduce_four_devices(tmp_path):
    out = tmp_path / "rho.npy"
    run_workers("mp_forward_worker", out)
    ref = np.asarray(forward_density((2, 2)))
    # same program, same layout, gloo vs in-process collectives: float32 rounding only
    np.testing.assert_allclose(np.load(out), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
