"""Two processes on one machine (gloo collectives, 2 CPU devices each) = one 4-device run."""

import numpy as np
import pytest

from tests.helpers.processes import forward_density, run_workers


@pytest.mark.multiprocess
def test_two_processes_reproduce_four_devices(tmp_path):
    """The forward density, and on every rank the host-side float64 distances (each rank on its
    own CPU device: process 0's is not addressable from process 1)."""
    out = tmp_path / "rho.npy"
    texts = run_workers("mp_forward_worker", out)
    chis = {t.split("chi(z=1) ")[1].split(",")[0] for t in texts}
    assert len(chis) == 1 and 2000 < float(chis.pop()) < 2500  # Planck18: chi(z=1) ~ 2300 Mpc/h
    ref = np.asarray(forward_density((2, 2)))
    # same program, same layout, gloo vs in-process collectives: float32 rounding only
    np.testing.assert_allclose(np.load(out), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.slow(seconds=45)  # 35 s of it process 1 sleeping
@pytest.mark.multiprocess
def test_a_peer_late_by_more_than_gloo_waits_for_passes_fli_barrier(tmp_path):
    """Process 1 reaches the first collective of a compiled program 35 s after process 0, both
    having passed ``fli.store.files.barrier`` first. gloo alone gives up on a peer more than 30 s late
    (measured at 45 s: "Gloo context initialization failed ... GetKeyValue() timed out"), and
    ``sync_global_devices`` is itself such a collective, so this fails unless the barrier waits
    through the coordination service; it is what broke two-process fli-nuts on a loaded machine."""
    out = tmp_path / "late.npy"
    run_workers("late_peer_worker", out)
    value, waited = np.load(out)
    assert value == 6.0  # 1 + 1 + 2 + 2: each process's two devices hold its rank + 1
    assert waited > 30.0, waited  # process 0 did wait for its late peer at the barrier
