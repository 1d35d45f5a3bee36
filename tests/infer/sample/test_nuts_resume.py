"""fli-nuts runs that stop and go on: extension, resume after SIGKILL or from a damaged
checkpoint, resume on another device layout, a kernel stepped from its checkpoint in a fresh
process, and a resume with another sampler refused. A file of its own so that pytest-xdist
(``--dist loadfile``, .ci/run) runs these slow tests beside test_nuts.py's rather than after them;
the default set's refusals, which read the session's ``chain`` and nothing else, are in
test_nuts.py, the file that makes it (here they made a second worker build it again).

The chains are tests/helpers/posterior.py's CHAIN of the small mock; ``chain`` (the
uninterrupted run, tests/infer/conftest.py) is the reference each one is compared with.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from fli.cli.nuts import main as nuts_main
from fli.infer.sample.run_store import complete_chunks, read_chunks
from tests.helpers.posterior import CHAIN, SMALL, truncate_state
from tests.helpers.processes import ROOT


def _run(args, **kw):
    return subprocess.run([sys.executable, "-m", "fli.cli.nuts", *args], capture_output=True, text=True, cwd=ROOT,
                          **kw)


@pytest.fixture(scope="module")
def first_eight(small_mock, tmp_path_factory):
    """The first 8 draws of ``chain`` (num_samples=2: two chunks of 4), on pdims (1, 1): the
    start that the extension and the relayout tests each continue on a copy."""
    run = tmp_path_factory.mktemp("nuts") / "eight"
    assert nuts_main([*SMALL, *CHAIN, f"mock={small_mock}", f"run_dir={run}", "inference.num_samples=2"]) == 0
    assert complete_chunks(run) == [0, 1]
    return run


@pytest.mark.slow(seconds=90)  # (89 s in CI with first_eight) resume is also checked by the SIGKILL test (slow)
def test_extending_a_chain_continues_it_bit_for_bit(small_mock, chain, first_eight, tmp_path):
    """8 draws, then the same run directory with num_samples raised to 12 draws in all: the
    draws and stats equal the 12-draw chain's, bitwise (state, adaptation and key resumed)."""
    run = tmp_path / "run"
    shutil.copytree(first_eight, run)
    assert nuts_main([*SMALL, *CHAIN, f"mock={small_mock}", f"run_dir={run}"]) == 0
    a, b = read_chunks(chain), read_chunks(run)
    for part in ("draws", "stats"):
        for name in a[part]:
            if name != "seconds":
                np.testing.assert_array_equal(a[part][name], b[part][name], err_msg=f"{part}.{name}")


@pytest.mark.slow(seconds=60)  # a new process compiles the posterior and the 4-draw chunk program
def test_the_kernel_steps_a_restored_state_in_a_fresh_process_without_init(chain, small_mock):
    """A kernel is pure functions: in a new process, the chain's checkpoint 1 restored onto
    ``kernel.template`` and stepped by the chunk program, with ``kernel.init`` replaced by a
    function that raises, gives the run's own chunk 2 draw for draw (same program, same
    devices: bitwise)."""
    worker = ROOT / "tests" / "helpers" / "kernel_worker.py"
    proc = subprocess.run([sys.executable, str(worker), str(chain), str(small_mock), "1", "4", *SMALL, *CHAIN],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "max |draw difference| = 0.0" in proc.stdout, proc.stdout + proc.stderr[-2000:]


@pytest.mark.slow(seconds=60)
def test_a_damaged_checkpoint_falls_back_to_the_one_before(small_mock, chain, tmp_path, caplog):
    """The newest checkpoint (after chunk 2) truncated: the run says so, resumes from
    checkpoint 1, and samples chunk 2 again exactly as the chain did."""
    run = tmp_path / "copy"
    shutil.copytree(chain, run)
    truncate_state(run / "checkpoints" / "2")
    with caplog.at_level("WARNING"):
        assert nuts_main([*SMALL, *CHAIN, f"mock={small_mock}", f"run_dir={run}", "inference.num_samples=10"]) == 0
    assert any("checkpoints/2 is" in r.message and "falling back to checkpoint 1" in r.message
               for r in caplog.records), [r.message for r in caplog.records]
    a, b = read_chunks(chain, [2]), read_chunks(run, [2])
    for name in a["draws"]:
        np.testing.assert_array_equal(a["draws"][name], b["draws"][name], err_msg=name)
    assert complete_chunks(run) == [0, 1, 2, 3]


@pytest.mark.slow(seconds=95)  # fresh-clone CI of 469bd9a: 94 s
def test_sigkill_mid_chunk_then_resume_matches_the_uninterrupted_chain(small_mock, chain, tmp_path):
    """kill -9 while a chunk runs: the rerun resumes after the last complete chunk, loses and
    duplicates none, and its draws equal the uninterrupted chain's bitwise."""
    cut = tmp_path / "cut"
    # the session's compilation cache (tests/conftest.py), which ``chain`` filled with these programs
    args = [*SMALL, *CHAIN, f"mock={small_mock}", f"run_dir={cut}"]
    p = subprocess.Popen([sys.executable, "-m", "fli.cli.nuts", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while time.time() - t0 < 900 and p.poll() is None:
        if complete_chunks(cut) == [0]:
            break
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    done = complete_chunks(cut)
    assert done and done[-1] < 2, "the chain finished before it was killed"
    r = _run(args, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming after chunk {done[-1]}" in r.stderr, r.stderr[-3000:]
    assert complete_chunks(cut) == [0, 1, 2]
    a, b = read_chunks(chain), read_chunks(cut)
    for part in ("draws", "stats"):
        for name in a[part]:
            if name != "seconds":
                np.testing.assert_array_equal(a[part][name], b[part][name], err_msg=f"{part}.{name}")
    assert os.path.isfile(cut / "nuts.json")


@pytest.mark.parametrize("old, new", [((2, 2), (1, 2)), pytest.param((1, 1), (2, 4), marks=pytest.mark.slow(seconds=5)),
                                      pytest.param((2, 4), (4, 2), marks=pytest.mark.slow(seconds=5))])
def test_the_relayout_permutation_carries_the_field_and_parameters(old, new):
    """A flat vector packed on one layout, permuted, equals the same field and parameters
    packed on the other (fli/infer/sample/relayout.py); new dummies are marked -1."""
    import jax
    import jax.numpy as jnp

    from fli.infer.posterior.layout import FlatLayout
    from fli.infer.sample.relayout import permutation
    from fli.sim.sharding import make_mesh, white_noise

    shape, n = (8, 8, 4), 2
    field = white_noise(1, shape, make_mesh(old))
    theta = jnp.asarray([0.3, -1.2], jnp.float32)
    a = np.asarray(FlatLayout(shape, make_mesh(old), n).pack(theta, field))
    b = np.asarray(FlatLayout(shape, make_mesh(new), n).pack(theta, jax.device_put(np.asarray(field))))
    src = permutation(shape, old, new, n)
    assert src.shape == b.shape
    moved = np.where(src >= 0, a[np.maximum(src, 0)], 0.0)
    np.testing.assert_array_equal(moved, b)  # dummies are 0 in both packs


@pytest.mark.slow(seconds=85)  # (a second layout compiles its own programs; 84 s in CI)
def test_resume_on_another_device_layout_continues_the_chain(small_mock, chain, first_eight, tmp_path, caplog):
    run = tmp_path / "relayout"
    shutil.copytree(first_eight, run)  # 8 draws on pdims (1, 1)
    assert nuts_main([*SMALL, *CHAIN, f"mock={small_mock}", f"run_dir={run}", "distributed.pdims=[2,2]"]) == 0
    assert complete_chunks(run) == [0, 1, 2]
    a, b = read_chunks(chain), read_chunks(run)
    # the first 8 draws are the uninterrupted chain's; the last 4 continue from its state on
    # the new layout (another momentum order, so not the same draws, but the same posterior)
    np.testing.assert_array_equal(a["draws"]["sigma8"][:8], b["draws"]["sigma8"][:8])
    assert np.all(np.isfinite(b["draws"]["sigma8"])) and b["stats"]["gradient_evals"][-1] > \
        b["stats"]["gradient_evals"][7]
    # the step size adapted on (1, 1) carries over: the warm-up is over, it no longer changes
    assert np.all(b["stats"]["step_size"][8:] == b["stats"]["step_size"][7])


@pytest.mark.slow(seconds=205)  # (204 s in CI) NumPyro's own layout compiled on two device layouts
def test_numpyros_own_layout_samples_resumes_on_another_layout_and_cannot_be_swapped(small_mock, tmp_path, capsys):
    """``inference.sampler=numpyro`` (the baseline the sharded sampler is measured against)
    runs through fli-nuts as the sharded one does: chunks, checkpoints, a resume on another
    device layout (its state is a global pytree: a plain reshard), and a resume with the other
    sampler is refused in one line naming the key. It is also the test that NumPyro's NUTS runs
    the whole sharded PM forward (pencil FFTs, CIC exchanges) on a mesh split on both axes:
    XLA's CPU FFT once crashed there, when local FFTs acted on 3D arrays."""
    run = tmp_path / "stock"
    base = [*SMALL, *CHAIN, f"mock={small_mock}", f"run_dir={run}", "inference.sampler=numpyro"]
    assert nuts_main([*base, "inference.num_samples=2"]) == 0  # 8 draws on pdims (1, 1)
    assert nuts_main([*base, "distributed.pdims=[2,2]"]) == 0  # 4 more on (2, 2)
    assert complete_chunks(run) == [0, 1, 2]
    b = read_chunks(run)
    assert np.all(np.isfinite(b["draws"]["sigma8"])) and b["stats"]["gradient_evals"][-1] > \
        b["stats"]["gradient_evals"][7]
    assert np.all(b["stats"]["step_size"][8:] == b["stats"]["step_size"][7])  # the adapted step size carried over
    assert json.loads((run / "nuts.json").read_text())["sampler"] == "numpyro"
    capsys.readouterr()
    assert nuts_main([*base[:-1], "inference.sampler=sharded", "inference.num_samples=10"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "inference.sampler" in err[0], err
