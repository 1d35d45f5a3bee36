"""fli-map as a user runs it: a small mock, the MAP, its outputs, bad input, SIGKILL and resume."""

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from fli.cli.map import main as map_main
from fli.infer.checkpoint import store as ckpt
from tests.helpers.posterior import SMALL
from tests.helpers.processes import ROOT


@pytest.fixture(scope="module")
def small_map(small_mock, tmp_path_factory):
    """A 12-step fli-map run of the small mock, without its Laplace step: fli-map's Laplace
    function is tested against a dense inverse in tests/infer/fit/test_laplace_model.py, and
    compiling it here (146 s of this fixture's 255 s in CI) would pay for it twice."""
    run = tmp_path_factory.mktemp("map") / "run"
    assert map_main([*SMALL, f"mock={small_mock}", f"run_dir={run}", "inference.map.steps=12",
                     "inference.map.checkpoint_every=5", "inference.map.laplace=false"]) == 0
    return run


@pytest.mark.slow(seconds=115)  # small_map: the MAP (with the small mock, where first); 112 s in CI, 145 s alone
def test_map_writes_its_outputs(small_map):
    out = json.loads((small_map / "map.json").read_text())
    for name in ("config.yaml", "loss_history.csv", "metrics.json", "loss.png", "kappa_maps.png",
                 "residuals.png", "transfer.png", "r_ell.png", "field_slices.png"):
        assert (small_map / name).is_file(), name
    assert (small_map / "map_field.zarr").is_dir()
    assert out["steps"] == 12 and out["grad_evals"] >= 12
    assert set(out["params"]) == {"Omega_c", "sigma8", "Omega_m", "S8"}
    assert out["params"]["S8"] == pytest.approx(out["params"]["sigma8"] * np.sqrt(out["params"]["Omega_m"] / 0.3),
                                                rel=1e-5)
    assert "not the maximum of the marginal posterior" in out["description"]
    # the loss went down, and the fit explains the data at the noise level (chi2 per pixel ~ 1)
    hist = np.loadtxt(small_map / "loss_history.csv", delimiter=",", skiprows=1)
    assert hist.shape == (12, 6) and hist[-1, 1] < hist[0, 1]
    assert 0.3 < out["chi2_per_pixel"] < 3.0
    assert out["truth"]["sigma8"] == pytest.approx(0.8102)
    assert "laplace" not in out  # inference.map.laplace=false
    assert ckpt.latest_step(small_map / "checkpoints") == 12


def _run(args, **kw):
    return subprocess.run([sys.executable, "-m", "fli.cli.map", *args], capture_output=True, text=True,
                          cwd=ROOT, **kw)


@pytest.mark.parametrize("over, match", [
    (["lensing.npix=4"], "lensing.npix"),
    (["prior.params.sigma8.low=1.5"], "prior.params.sigma8.low/high"),
    (["prior.sample=[Omega_c,sigma9]"], "prior.sample"),
    (["prior.params.Omega_c.low=0.05"], "prior corner"),
    (["simulation.mesh=[8,8,16]", "lensing.n_planes=4"], "simulation.mesh"),
    (["simulation.box=[320.0,320.0,3800.0]"], "simulation.box"),
    (["inference.map.estimator=muse", "inference.map.fix_cosmology=true"], "inference.map.estimator=muse"),
    (["inference.map.estimator=muse", "prior.sample=[]"], "inference.map.estimator=muse"),
    (["inference.map.estimator=mu"], "inference.map.estimator"),
    (["inference.map.muse.spread=nodes"], "inference.map.muse.spread"),
    (["inference.map.muse.estimate=mean"], "inference.map.muse.estimate"),
    (["inference.map.muse.h_steps=0"], "inference.map.muse.h_steps"),
    (["inference.map.muse.n_sims=8", "inference.map.muse.j_sims=6"], "inference.map.muse.j_sims"),
    (["inference.map.muse.start=[0.1,nan]"], "inference.map.muse.start"),
    (["inference.map.estimator=muse", "inference.map.muse.start=[0.1]"], "inference.map.muse.start has 1 values"),
])
def test_bad_input_is_refused_and_nothing_written(small_mock, tmp_path, capsys, over, match):
    run = tmp_path / "refused"
    assert map_main([*SMALL, f"mock={small_mock}", f"run_dir={run}", *over]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fli-map: error:") and match in err[0], err
    assert not run.exists()


def test_bad_observations_are_refused(small_mock, tmp_path, capsys):
    import zarr

    cases = []
    d = tmp_path / "incomplete"
    shutil.copytree(small_mock / "mock.zarr", d / "mock.zarr")
    (d / "mock.zarr" / "COMPLETE").unlink()
    cases.append((d, "incomplete"))
    from fli.store.fingerprint import record

    for name, value, match in (("kappa_obs", np.nan, "non-finite"), ("noise_sigma", 0.0, "noise_sigma")):
        for recorded in (True, False):
            d = tmp_path / f"{name}_{recorded}"
            shutil.copytree(small_mock / "mock.zarr", d / "mock.zarr")
            g = zarr.open_group(str(d / "mock.zarr"), mode="r+")
            g[name][(0, 0, 0) if name == "kappa_obs" else (0,)] = value
            if recorded:  # written so by its maker: the values themselves are refused
                record(g)
                cases.append((d, match))
            else:  # changed after writing: the fingerprint tells first
                cases.append((d, f"{name}: chunk 0"))
    for obs, match in cases:
        run = tmp_path / f"run_{obs.name}"
        assert map_main([*SMALL, f"mock={obs}", f"run_dir={run}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and match in err[0], err
        assert not run.exists()


def test_particles_outrunning_the_halo_stop_the_fit_at_the_next_checkpoint(small_mock, tmp_path, capsys, monkeypatch,
                                                                          caplog):
    # At 32x32x128 the MAP's particles outran halos of 4 and 6 cells; fli-map ran its 200 steps
    # first and only then refused. Here fli.sim.painting's own check runs with a halo of 1e-6 cells,
    # which any displacement outruns: the fit must stop at its first checkpoint (step 2 of 6).
    from fli.sim import painting

    real = painting.check_halo
    monkeypatch.setattr(painting, "check_halo",
                        lambda m, halo, policy="raise", scheme="cic": real(m, 1e-6, policy, scheme))
    run = tmp_path / "run"
    # Adam: the claim is the halo's, not the optimiser's, and Adam's step compiles in a fraction
    # of L-BFGS's line search (two compiles here: halo 2, then 3)
    fit = ["inference.map.steps=6", "inference.map.checkpoint_every=2", "inference.map.laplace=false",
           "inference.map.optimizer=adam"]
    assert map_main([*SMALL, f"mock={small_mock}", f"run_dir={run}", *fit]) == 2
    err = capsys.readouterr().err
    assert "simulation.halo: at step 2 of 6 of the MAP particles moved" in err and "the fit stopped there" in err
    assert "a larger simulation.halo resumes it from step 2" in err
    assert len((run / "loss_history.csv").read_text().splitlines()) == 1 + 2 and not (run / "map.json").exists()
    # the halo is how the forward is computed, not which posterior it is: the same run resumes
    # with a larger one (here the real check again) and finishes its 6 steps from step 2
    monkeypatch.setattr(painting, "check_halo", real)
    caplog.set_level(logging.INFO, logger="fli")
    assert map_main([*SMALL, f"mock={small_mock}", f"run_dir={run}", *fit, "simulation.halo=3"]) == 0
    assert "resuming from the checkpoint of step 2" in caplog.text
    assert len((run / "loss_history.csv").read_text().splitlines()) == 1 + 6 and (run / "map.json").exists()


def test_truth_metrics_need_a_truth(small_mock, tmp_path, capsys):
    from fli.store.io import load_observation, write_observation

    o = load_observation(small_mock)
    obs = tmp_path / "obs"
    write_observation(obs / "observation.zarr", np.asarray(o.kappa_obs), o.noise_sigma,
                      np.stack([b.z for b in o.nz_bins]), np.stack([b.nz for b in o.nz_bins]), o.fov_deg)
    run = tmp_path / "run"
    assert map_main([*SMALL, f"mock={obs}", f"run_dir={run}", "inference.map.compare_truth=true"]) == 2
    err = capsys.readouterr().err
    assert "compare_truth" in err and "no truth" in err
    assert not run.exists()


@pytest.mark.slow(seconds=5)  # reads small_map, which the first slow test of this file pays for
def test_resuming_with_another_model_config_is_refused(small_mock, small_map, tmp_path, capsys):
    run = tmp_path / "again"
    shutil.copytree(small_map, run)
    (run / "map.json").unlink()
    before = sorted(p.name for p in run.iterdir())
    assert map_main([*SMALL, f"mock={small_mock}", f"run_dir={run}", "inference.map.steps=20",
                     "prior.params.sigma8.high=1.0"]) == 2
    err = capsys.readouterr().err
    assert "prior.params.sigma8.high = 1.1" in err and "1.0" in err
    assert sorted(p.name for p in run.iterdir()) == before


@pytest.mark.slow(seconds=100)  # 91 s beside two niced studies: three fli-map runs of 100 steps, a private cache
def test_sigkill_then_resume_ends_where_an_uninterrupted_run_ends(small_mock, tmp_path):
    """Adam, same layout: the resumed run's MAP field and parameters equal the uninterrupted
    one's bitwise (the optimiser state, the step and the schedule all come back)."""
    import zarr

    cache = tmp_path / "jax-cache"
    common = [*SMALL, f"mock={small_mock}", "inference.map.optimizer=adam", "inference.map.steps=100",
              "inference.map.checkpoint_every=20", "inference.map.tol=0", "inference.map.laplace=false",
              "inference.map.compare_truth=false", f"compilation_cache={cache}"]
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    r = _run([*common, f"run_dir={ref}"], timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    env = dict(os.environ)
    p = subprocess.Popen([sys.executable, "-m", "fli.cli.map", *common, f"run_dir={cut}"], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while time.time() - t0 < 600:
        if (cut / "checkpoints").exists() and (ckpt.latest_step(cut / "checkpoints") or 0) >= 20:
            break
        if p.poll() is not None:
            break
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not (cut / "map.json").exists(), "the run finished before it was killed: lengthen it"
    killed_at = ckpt.latest_step(cut / "checkpoints")
    assert killed_at is not None and 20 <= killed_at < 100
    r = _run([*common, f"run_dir={cut}"], timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming from the checkpoint of step {killed_at}" in r.stderr
    a = np.asarray(zarr.open_group(str(ref / "map_field.zarr"), mode="r")["white_noise"][...])
    b = np.asarray(zarr.open_group(str(cut / "map_field.zarr"), mode="r")["white_noise"][...])
    np.testing.assert_array_equal(a, b)
    ja, jb = (json.loads((d / "map.json").read_text()) for d in (ref, cut))
    assert ja["params"] == jb["params"] and ja["loss"] == jb["loss"] and ja["steps"] == jb["steps"] == 100
    ha = np.loadtxt(ref / "loss_history.csv", delimiter=",", skiprows=1)
    hb = np.loadtxt(cut / "loss_history.csv", delimiter=",", skiprows=1)
    np.testing.assert_array_equal(ha[:, 1], hb[:, 1])  # the same loss at every step


@pytest.mark.slow(seconds=25)
def test_annealing_runs_its_stages_then_the_exact_likelihood(small_mock, tmp_path):
    run = tmp_path / "anneal"
    assert map_main([*SMALL, f"mock={small_mock}", f"run_dir={run}", "inference.map.steps=14",
                     "inference.map.anneal=true", "inference.map.anneal_steps=3", "inference.map.tol=0",
                     "inference.map.anneal_arcmin=[120.0,60.0]", "inference.map.laplace=false"]) == 0
    hist = np.loadtxt(run / "loss_history.csv", delimiter=",", skiprows=1)
    np.testing.assert_array_equal(hist[:, 5], [0, 0, 0, 1, 1, 1] + [2] * 8)  # two widths, then exact
    out = json.loads((run / "map.json").read_text())
    assert out["anneal"] is True and out["steps"] == 14


@pytest.mark.slow(seconds=140)  # fresh-clone CI of 469bd9a: 137 s
def test_resume_on_another_device_layout(small_map, small_mock, tmp_path):
    """A run checkpointed on one device continues on pdims (2, 2) (orbax restores onto the new
    sharding; not bitwise: reductions reorder) and ends with a fit as good."""
    run = tmp_path / "moved"
    shutil.copytree(small_map, run)
    (run / "map.json").unlink()
    assert map_main([*SMALL, f"mock={small_mock}", f"run_dir={run}", "inference.map.steps=16",
                     "distributed.pdims=[2,2]", "inference.map.laplace=false"]) == 0
    a, b = (json.loads((d / "map.json").read_text()) for d in (small_map, run))
    assert b["steps"] == 16 and b["pdims"] == [2, 2]
    hist = np.loadtxt(run / "loss_history.csv", delimiter=",", skiprows=1)
    ref = np.loadtxt(small_map / "loss_history.csv", delimiter=",", skiprows=1)
    np.testing.assert_array_equal(hist[:12], ref)  # the first 12 steps come from the checkpoint
    assert b["loss"] <= a["loss"] * (1 + 1e-5)  # four more L-BFGS steps do not lose ground


def test_a_laplace_block_is_read_back_only_at_its_own_point_and_settings(tmp_path):
    """``laplace.json`` stands in for the Laplace step only where the step, theta and the CG
    settings are the ones it was computed at; a file cut short or missing means computing it."""
    from types import SimpleNamespace

    import jax.numpy as jnp

    from fli.infer.fit.map import LAPLACE_JSON, laplace_key, reusable_laplace
    from fli.infer.posterior.model import Latents
    from fli.infer.fit.optimize import MapRun

    mcfg = SimpleNamespace(cg_tol=1e-5, cg_maxiter=1000)
    run = MapRun(Latents(jnp.asarray([0.25, -0.5], jnp.float32), jnp.zeros((2, 2, 2))), None, 40, [], None)
    block = {"marginal": {"std": {"sigma8": 0.03}}, "n_hvp": 159}
    assert reusable_laplace(tmp_path, laplace_key(run, mcfg)) is None  # no file
    (tmp_path / LAPLACE_JSON).write_text(json.dumps({"key": laplace_key(run, mcfg), "laplace": block}))
    assert reusable_laplace(tmp_path, laplace_key(run, mcfg)) == block
    other_point = MapRun(Latents(jnp.asarray([0.25, -0.5000001], jnp.float32), run.params.s), None, 40, [], None)
    later = MapRun(run.params, None, 41, [], None)
    for key in (laplace_key(other_point, mcfg), laplace_key(later, mcfg),
                laplace_key(run, SimpleNamespace(cg_tol=1e-6, cg_maxiter=1000)),
                laplace_key(run, SimpleNamespace(cg_tol=1e-5, cg_maxiter=500))):
        assert reusable_laplace(tmp_path, key) is None, key
    text = (tmp_path / LAPLACE_JSON).read_text()
    (tmp_path / LAPLACE_JSON).write_text(text[: len(text) // 2])  # cut short by a stop
    assert reusable_laplace(tmp_path, laplace_key(run, mcfg)) is None
