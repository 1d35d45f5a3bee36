"""fli-mock end to end: the CLI, layout independence, reading back, bad input, interrupted writes."""

import json
import shutil
import sys

import jax
import numpy as np
import pytest

from fli.cli.compose import compose
from fli.cli.mock import main
from fli.store.fingerprint import DamagedData
from fli.store.io import COMPLETE, MockError, load_mock, write_arrays
from fli.mock import add_shape_noise, make_mock
from fli.sim.sharding import make_mesh, process_allgather
from tests.helpers.physics import ccl_cosmology
from tests.helpers.posterior import SMALL
from tests.helpers.processes import ROOT, free_port, launch

TINY = ["experiment=tiny"]


@pytest.fixture(scope="module")
def mock_dir(small_mock):
    """The session's small mock (tests/conftest.py): made on the default layout (1 device)
    through the command's entry point."""
    return small_mock


def test_cli_writes_a_complete_mock_with_figures(mock_dir):
    for name in ("config.yaml", "summary.json", "kappa_maps.png", "matter_power.png", "kappa_cl.png"):
        assert (mock_dir / name).is_file(), name
    assert (mock_dir / "mock.zarr" / COMPLETE).is_file()
    m = load_mock(mock_dir)
    cfg, _ = compose(SMALL)
    nb, npix = len(cfg.survey.bins), cfg.lensing.npix
    assert m.kappa_obs.shape == m.kappa_true.shape == (nb, npix, npix)
    assert m.white_noise.shape == tuple(cfg.simulation.mesh)
    assert m.truth["Omega_c"] == pytest.approx(cfg.cosmology.Omega_c)
    assert m.config["simulation"]["mesh"] == list(cfg.simulation.mesh)
    # the noise is what the survey config says: sigma_e / sqrt(n_gal A_pix)
    a_pix = (cfg.lensing.fov_deg * 60 / npix) ** 2
    np.testing.assert_allclose(m.noise_sigma, cfg.survey.sigma_e / np.sqrt(10.0 * a_pix), rtol=1e-12)
    resid = (m.kappa_obs - m.kappa_true) / m.noise_sigma[:, None, None]
    # 2 x 64 unit Gaussians: std within 5 sigma of its sampling error (1/sqrt(2 * 512))
    assert abs(resid.std() - 1) < 5 / np.sqrt(2 * resid.size)
    # ... and it is add_shape_noise of the seed, which scripts use to remake a mock's data
    np.testing.assert_array_equal(np.asarray(add_shape_noise(cfg.seed, m.kappa_true, m.noise_sigma).kappa),
                                  m.kappa_obs)
    # the convergence is a signal, not zeros: its rms is of order 1e-3 on these scales
    assert 1e-4 < m.kappa_true.std() < 1e-1
    summary = json.loads((mock_dir / "summary.json").read_text())
    assert summary["max_disp_cells"] < cfg.simulation.halo


@pytest.mark.parametrize("pdims", [[2, 4], pytest.param([2, 2], marks=pytest.mark.slow(seconds=10))])
def test_mock_is_the_same_on_every_layout_and_reads_back_anywhere(mock_dir, pdims):
    """Made on 8 devices (both axes split; 4 devices in the slow set), the mock equals the
    1-device one, and the 1-device one reads back sharded on that layout."""
    ref = load_mock(mock_dir)
    cfg, _ = compose([*SMALL, f"distributed.pdims=[{pdims[0]},{pdims[1]}]"])
    m = make_mock(cfg)
    np.testing.assert_array_equal(process_allgather(m["white_noise"]), ref.white_noise)  # bitwise
    kt = process_allgather(m["kappa_true"])
    # float32, different reduction orders on different layouts: 1e-5 of the map's scale
    np.testing.assert_allclose(kt, ref.kappa_true, rtol=1e-5, atol=1e-5 * np.abs(ref.kappa_true).max())
    np.testing.assert_allclose(process_allgather(m["kappa_obs"]), ref.kappa_obs, rtol=1e-5,
                               atol=1e-5 * np.abs(ref.kappa_obs).max())
    sharded = load_mock(mock_dir, make_mesh(tuple(pdims)))
    assert sharded.kappa_obs.sharding.spec == jax.sharding.PartitionSpec(None, "x", "y")
    np.testing.assert_array_equal(np.asarray(sharded.kappa_obs), ref.kappa_obs)
    np.testing.assert_array_equal(np.asarray(sharded.white_noise), ref.white_noise)


@pytest.mark.multiprocess
@pytest.mark.slow(seconds=45)
def test_two_process_mock_equals_single_process(mock_dir, tmp_path):
    run, port = tmp_path / "mp", free_port()
    argv = [sys.executable, "-m", "fli.cli.mock", *SMALL, f"run_dir={run}", "distributed.pdims=[2,2]",
            f"distributed.coordinator=127.0.0.1:{port}", "distributed.num_processes=2",
            "distributed.local_device_count=2"]
    res = launch(lambda i: [*argv, f"distributed.process_id={i}"])
    for rc, text in res:
        assert rc == 0, text[-3000:]
    ref, mp = load_mock(mock_dir), load_mock(run)
    np.testing.assert_array_equal(mp.white_noise, ref.white_noise)
    np.testing.assert_allclose(mp.kappa_true, ref.kappa_true, rtol=1e-5, atol=1e-5 * np.abs(ref.kappa_true).max())
    np.testing.assert_allclose(mp.kappa_obs, ref.kappa_obs, rtol=1e-5, atol=1e-5 * np.abs(ref.kappa_obs).max())


@pytest.mark.parametrize("override,needle", [
    (["lensing.fov_deg=20"], "lensing.fov_deg"),
    (["simulation.box=[400,400,2000]"], "simulation.box[2]"),
    (["lensing.n_planes=7"], "lensing.n_planes"),
    (["lensing.npix=18", "distributed.pdims=[4,1]"], "lensing.npix"),
    (["survey.bins=[{kind:table,z:[0.5,1.0],nz:[0,0]}]"], "survey.bins[0]"),
])
def test_bad_lensing_config_fails_before_writing(override, needle, tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TINY, *override, f"run_dir={run}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not run.exists()


def test_refuses_to_overwrite_a_mock(mock_dir, capsys):
    assert main([*SMALL, f"run_dir={mock_dir}"]) == 2
    assert "already holds a mock" in capsys.readouterr().err


def test_incomplete_or_broken_mocks_do_not_load(mock_dir, tmp_path):
    with pytest.raises(MockError, match="no mock at"):
        load_mock(tmp_path)
    # interrupted: arrays written, marker not
    part = tmp_path / "partial" / "mock.zarr"
    write_arrays(part, {"kappa_obs": np.zeros((1, 4, 4), np.float32)}, {"fli_format": 1})
    with pytest.raises(MockError, match="incomplete"):
        load_mock(part.parent)
    # a complete mock with an array removed
    broken = tmp_path / "broken"
    shutil.copytree(mock_dir, broken)
    shutil.rmtree(broken / "mock.zarr" / "kappa_true")
    with pytest.raises(DamagedData, match=r"array\(s\) missing: \['kappa_true'\]"):  # its fingerprint tells
        load_mock(broken)
    # mismatched shapes
    bad = tmp_path / "bad" / "mock.zarr"
    write_arrays(bad, {"kappa_obs": np.zeros((2, 4, 4), np.float32), "kappa_true": np.zeros((2, 4, 4), np.float32),
                       "noise_sigma": np.ones(3), "white_noise": np.zeros((4, 4, 4), np.float32)},
                 {"fli_format": 1})
    (bad / COMPLETE).write_text("{}")
    with pytest.raises(MockError, match="mismatched shapes"):
        load_mock(bad.parent)
    # garbage where the metadata should be
    junk = tmp_path / "junk"
    shutil.copytree(mock_dir, junk)
    (junk / "mock.zarr" / "zarr.json").write_text("not json")
    with pytest.raises(MockError, match="unreadable"):
        load_mock(junk)


def test_kappa_figure_scales_the_observed_map_by_its_own_range_not_a_fixed_multiple():
    """The observed map's colour limit is its 99.5th percentile of |kappa|, never below the noiseless
    map's. At low shape noise (sigma_e 0.02 on an 8x8 map) the old limit, 3x the noiseless one,
    drew the observed signal in a third of the colour range."""
    from fli.plots import kappa_colour_limits

    rng = np.random.default_rng(0)
    signal = rng.normal(0.0, 1e-3, (64, 64))
    # low noise: one shared scale, within the noise's shift of the 99.5th percentile
    lo_true, lo_obs = kappa_colour_limits(signal, signal + rng.normal(0.0, 1e-5, signal.shape))
    assert lo_obs == pytest.approx(lo_true, rel=0.05)
    # noise-dominated: the observed limit clips half a percent of the observed pixels (one more pixel:
    # the percentile interpolates between two)
    noisy = signal + rng.normal(0.0, 1e-2, signal.shape)
    hi_true, hi_obs = kappa_colour_limits(signal, noisy)
    assert hi_obs > 5 * hi_true
    assert np.mean(np.abs(noisy) > hi_obs) <= 0.005 + 1 / noisy.size
    # an observed map quieter than the noiseless one never shrinks below the noiseless limit
    assert kappa_colour_limits(signal, 0.1 * signal)[1] == hi_true


def test_run_module_entry_point_help():
    rc = launch(lambda i: [sys.executable, "-m", "fli.cli.mock", "--help"], n=1, timeout=120)[0]
    assert rc[0] == 0 and "experiment=tiny" in rc[1]
    assert ROOT.is_dir()


@pytest.mark.slow(seconds=20)
def test_noiseless_mock_cl_matches_limber_over_seeds():
    """Map C_ell of noiseless PM mocks, averaged over 8 seeds, against plane-sum Limber.

    Configuration: 64^3 particles in 500 x 500 x 2000 Mpc/h, one source bin z in [0.3, 0.8],
    a 12 deg map of 32^2 pixels; ell from 2 pi / fov = 30 to 150 (half the map Nyquist is 240),
    where k_perp = ell / r at the lensing kernel's peak (r ~ 700 Mpc/h) is below 0.25 k_Nyq.
    """
    from fli.forward import build_forward, fiducial_cosmology
    from fli.lensing.limber import limber_cl_planes, map_power_spectrum
    from fli.sim.sharding import white_noise

    # the prior's lowest Omega_c is raised to 0.22: below ~0.2 the z = 0.8 sources lie beyond 2000 Mpc/h
    cfg, _ = compose([*TINY, "simulation.mesh=[64,64,64]", "simulation.box=[500,500,2000]",
                      "simulation.halo=4", "lensing.n_planes=16", "lensing.fov_deg=12", "lensing.npix=32",
                      "survey.bins=[{kind:smail,z0:0.5,z_min:0.3,z_max:0.8,n_gal:10}]",
                      "distributed.pdims=[1,2]", "prior.params.Omega_c.low=0.22"])
    fwd = build_forward(cfg)
    cosmo, grid, geom, bins = fiducial_cosmology(cfg), fwd.grid, fwd.geometry, list(fwd.bins)
    kappa = jax.jit(lambda s: fwd(cosmo, s)[0])

    edges = np.array([30.0, 60.0, 90.0, 120.0, 150.0])
    cls = []
    for seed in range(8):
        ell, cl, _ = map_power_spectrum(kappa(white_noise(seed, grid.shape, grid.mesh)), cfg.lensing.fov_deg,
                                        ell_edges=edges, taper=0.5)
        cls.append(np.asarray(cl)[0])
    cls = np.array(cls)
    # the PM (with its force correction) grows nonlinear power at these scales, so the model is
    # the plane-sum Limber of halofit (pyccl: P_nl / P_lin on the planes) times the mesh window
    import pyccl

    cc = ccl_cosmology(cosmo, "halofit")
    kp = np.asarray(ell)[:, None] / geom.plane_r[None, :] * cosmo.h  # [n_ell, n_planes] in 1/Mpc
    boost = np.stack([pyccl.nonlin_matter_power(cc, kp[:, i], a) / pyccl.linear_matter_power(cc, kp[:, i], a)
                      for i, a in enumerate(geom.plane_a)], axis=1)
    lin = np.asarray(limber_cl_planes(cosmo, bins, np.asarray(ell), geom, mesh_window=8))[0, 0]
    theory = np.asarray(limber_cl_planes(cosmo, bins, np.asarray(ell), geom, mesh_window=8, boost=boost))[0, 0]
    ratio = cls / theory  # [seed, ell bin]
    per_seed = ratio.mean(axis=1)  # average over the 4 ell bins, one number per seed
    mean, err = per_seed.mean(), per_seed.std(ddof=1) / np.sqrt(len(per_seed))
    # tolerance = 3 x the measured cosmic-variance error of the mean (~0.05) + 15% model error:
    # the window model (CIC sinc^4 x bilinear sinc^4) is approximate, and the PM at 7.8 Mpc/h
    # cells resolves halofit's power only up to k h ~ 1 (ell ~ 90 on the nearest planes).
    # Measured, mean over 8 seeds per ell bin: 0.958 1.007 0.992 0.982 of the halofit model,
    # 0.965 1.039 1.058 1.087 of the linear one. Gross errors (a factor a_i, Omega_m, dr or 2
    # in amplitude) fail it.
    assert abs(mean - 1) < 3 * err + 0.15, (mean, err, ratio.mean(axis=0), (cls / lin).mean(axis=0))
    assert err < 0.1  # the check has teeth: 8 seeds pin the mean to better than 10%


@pytest.mark.multiprocess
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed (Debian: openmpi-bin)")
@pytest.mark.slow(seconds=25)  # (an Open MPI launch of fli-mock)
def test_mpirun_launch_autodetects_and_matches(mock_dir, tmp_path):
    """`mpirun -n 2 fli-mock ...` with no coordinator: jax.distributed finds Open MPI's variables,
    and without run_dir both processes agree on one timestamped run directory."""
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "2", sys.executable, "-m", "fli.cli.mock",
           *SMALL, "distributed.pdims=[2,2]", "distributed.local_device_count=2"]
    rc, out = launch(lambda i: cmd, n=1, cwd=tmp_path)[0]
    assert rc == 0, out[-3000:]
    runs = list((tmp_path / "outputs" / "mock").iterdir())
    assert len(runs) == 1, runs
    run = runs[0]
    assert json.loads((run / "summary.json").read_text())["processes"] == 2
    ref, mp = load_mock(mock_dir), load_mock(run)
    np.testing.assert_array_equal(mp.white_noise, ref.white_noise)
    np.testing.assert_allclose(mp.kappa_true, ref.kappa_true, rtol=1e-5, atol=1e-5 * np.abs(ref.kappa_true).max())


def test_particles_outrunning_the_halo_stop_the_mock(tmp_path, capsys):
    """sigma8 = 2.5 moves tiny's particles ~2.6 cells: a 2-cell halo must refuse, not clip silently."""
    run = tmp_path / "run"
    assert main([*TINY, "cosmology.sigma8=2.5", "simulation.halo=2", f"run_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert "simulation.halo: particles moved" in err and "increase simulation.halo" in err
    assert not run.exists()
