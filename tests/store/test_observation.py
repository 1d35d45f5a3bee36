"""The observation format: the converter, load_observation, its errors, check_observation, and
write_mock's output read back as an observation with a truth."""

import dataclasses
import shutil
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from fli.config import Config, ConfigError, LensingConfig, NzBinConfig, SimulationConfig, SurveyConfig
from fli.store.io import (
    COMPLETE,
    MockError,
    ObservationError,
    check_observation,
    load_mock,
    load_observation,
    mark_complete,
    write_arrays,
)
from fli.sim.sharding import make_mesh
from fli.cli.observe import main as observe_main
from fli.lensing.survey import N_Z, nz_bins_from_config

# the console script as pip installs it beside this interpreter, else the one on PATH
SCRIPT = Path(sys.executable).parent / "fli-observe"
SCRIPT = str(SCRIPT) if SCRIPT.exists() else (shutil.which("fli-observe") or "fli-observe")
NB, NPIX, FOV = 2, 8, 5.0
MESH = [8, 8, 16]
BOX = [300.0, 300.0, 3200.0]


convert = observe_main


def survey_cfg():
    return SurveyConfig(bins=[NzBinConfig(z0=0.4, z_min=0.2, z_max=0.8, n_gal=8.0),
                              NzBinConfig(z0=0.8, z_min=0.8, z_max=1.6, n_gal=12.0)])


def analysis_cfg(**kw):
    """A validated config that agrees with the groups written here."""
    cfg = Config(name="t", simulation=SimulationConfig(mesh=list(MESH), box=list(BOX), halo=2),
                 lensing=LensingConfig(npix=NPIX, fov_deg=FOV), survey=survey_cfg())
    return dataclasses.replace(cfg, **kw)


def mock_group(path, drop=(), nz_tables=True, **overrides):
    """A small mock-like group written with fli.store.io's writers (fli-mock's layout, no simulation)."""
    rng = np.random.default_rng(1)
    bins = nz_bins_from_config(survey_cfg())
    kt = rng.normal(0, 0.01, (NB, NPIX, NPIX)).astype(np.float32)
    arrays = {"kappa_true": kt, "kappa_obs": kt + np.float32(0.02) * rng.normal(size=kt.shape).astype(np.float32),
              "white_noise": rng.normal(size=MESH).astype(np.float32), "noise_sigma": np.array([0.02, 0.03])}
    attrs = {"fli_format": 1, "units": {"kappa": "convergence (dimensionless)"}, "seed": 3,
             "truth": {"Omega_c": 0.26, "sigma8": 0.81},
             "config": {"simulation": {"mesh": MESH, "box": BOX}, "lensing": {"fov_deg": FOV, "npix": NPIX},
                        "survey": dataclasses.asdict(survey_cfg())}}
    if nz_tables:
        arrays["nz_z"] = np.stack([b.z for b in bins])
        arrays["nz"] = np.stack([b.nz for b in bins])
        attrs.update(fov_deg=FOV, npix=NPIX, n_gal=[b.n_gal for b in bins])
    for k, v in overrides.items():
        (arrays if isinstance(v, np.ndarray) else attrs)[k] = v
    for k in drop:
        arrays.pop(k, None)
        attrs.pop(k, None)
    path = Path(path)
    write_arrays(path, arrays, attrs)
    mark_complete(path, {})
    return path, bins


# ============================================================================ converter


def _inputs(tmp, n_z=50):
    rng = np.random.default_rng(0)
    kappa = rng.normal(0, 0.02, (NB, NPIX, NPIX)).astype(np.float32)
    z = np.linspace(0.0, 2.0, n_z)
    nz = np.stack([np.exp(-((z - 0.5) ** 2) / 0.1), 3.0 * np.exp(-((z - 1.0) ** 2) / 0.1)])
    mask = np.ones((NPIX, NPIX), bool)
    mask[:2, :3] = False
    np.save(tmp / "kappa.npy", kappa)
    np.save(tmp / "mask.npy", mask)
    np.savez(tmp / "nz.npz", z=z, nz=nz)
    for i in range(NB):
        np.savetxt(tmp / f"bin{i}.txt", np.c_[z, nz[i]])
    return kappa, mask, z, nz


@pytest.mark.parametrize("with_mask", [True, False])
def test_converter_round_trip(tmp_path, with_mask):
    """The script as a user runs it (subprocess), read back by load_observation, on a mesh too."""
    n_z = 50 if with_mask else N_Z  # 50 points are interpolated onto N_Z; N_Z points are kept
    kappa, mask, z, nz = _inputs(tmp_path, n_z)
    args = ["--kappa", "kappa.npy", "--fov-deg", str(FOV), "--out", "obs"]
    if with_mask:
        kappa[0, 0, 0] = np.nan  # masked: allowed, stored as 0
        np.save(tmp_path / "kappa.npy", kappa)
        args += ["--sigma", "0.02,0.03", "--nz", "nz.npz", "--mask", "mask.npy"]
    else:
        args += ["--sigma", "0.025", "--nz-txt", "bin0.txt", "bin1.txt"]
    res = subprocess.run([SCRIPT, *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    obs = load_observation(tmp_path / "obs")
    assert obs.path == tmp_path / "obs" / "observation.zarr" and (obs.path / COMPLETE).is_file()
    assert not obs.has_truth and obs.kappa_true is obs.white_noise is obs.truth is obs.config is None
    assert obs.fov_deg == FOV and obs.kappa_obs.dtype == np.float32
    if with_mask:
        np.testing.assert_array_equal(obs.mask, mask)
        np.testing.assert_array_equal(obs.kappa_obs, np.where(mask, kappa, 0))  # NaN under the mask -> 0
        np.testing.assert_array_equal(obs.noise_sigma, [0.02, 0.03])
    else:
        assert obs.mask is None
        np.testing.assert_array_equal(obs.kappa_obs, kappa)
        np.testing.assert_array_equal(obs.noise_sigma, [0.025, 0.025])
    for i, b in enumerate(obs.nz_bins):
        assert b.z.shape == b.nz.shape == (N_Z,)
        # normalised by the trapezoid rule, so to rounding (1e-12 of 1)
        assert abs(np.trapezoid(b.nz, b.z) - 1) < 1e-12
        # the shape is the table's: linear interpolation of a smooth table at dz = 0.04 is good
        # to ~ dz^2 max|n''| / 8 ~ 4e-3 of the peak; the N_Z table is its own grid (exact)
        ref = np.interp(b.z, z, nz[i]) / np.trapezoid(np.interp(b.z, z, nz[i]), b.z)
        np.testing.assert_allclose(b.nz, ref, rtol=0, atol=(5e-3 if with_mask else 1e-12) * ref.max())
        if not with_mask:
            np.testing.assert_array_equal(b.z, z)
    sharded = load_observation(tmp_path / "obs" / "observation.zarr", make_mesh((2, 2)))
    assert sharded.kappa_obs.sharding.spec == jax.sharding.PartitionSpec(None, "x", "y")
    np.testing.assert_array_equal(np.asarray(sharded.kappa_obs), obs.kappa_obs)
    check_observation(obs, analysis_cfg())  # agrees with a matching config


def test_converter_help_explains_the_format(capsys):
    with pytest.raises(SystemExit) as e:
        convert(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for word in ("kappa_obs", "noise_sigma", "nz_z", "mask", "COMPLETE", "docs/observation.md", "--nz-txt"):
        assert word in out, word


def _bad_inputs(tmp):
    kappa, mask, z, nz = _inputs(tmp)
    k = kappa.copy()
    k[1, 4, 4], k[0, 3, 3] = np.nan, np.inf
    np.save(tmp / "kappa_nan.npy", k)
    np.save(tmp / "kappa_int.npy", np.zeros((NB, NPIX, NPIX), int))
    np.save(tmp / "mask_small.npy", np.ones((NPIX // 2, NPIX // 2), bool))
    np.save(tmp / "mask_none.npy", np.zeros((NPIX, NPIX), bool))
    np.save(tmp / "sigma3.npy", np.array([0.1, 0.2, 0.3]))
    np.savez(tmp / "nz_neg.npz", z=z, nz=nz - 0.1)
    np.savez(tmp / "nz_zero.npz", z=z, nz=0 * nz)
    zz = z.copy()
    zz[5] = zz[4]
    np.savez(tmp / "nz_flat_z.npz", z=zz, nz=nz)
    np.savez(tmp / "nz_wrong.npz", z=z, nz=nz[:1])
    np.savez(tmp / "nz_keys.npz", zed=z, nz=nz)


BASE = ["--kappa", "kappa.npy", "--sigma", "0.02,0.03", "--nz", "nz.npz", "--fov-deg", "5"]


def _with(**repl):
    argv = list(BASE)
    for flag, value in repl.items():
        flag = "--" + flag.replace("_", "-")
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, *value.split()]
    return argv


@pytest.mark.parametrize("argv,needle", [
    (_with(kappa="kappa_nan.npy"), "--kappa kappa_nan.npy has 2 non-finite pixel(s)"),
    (_with(kappa="kappa_int.npy"), "dtype int64"),
    (_with(kappa="missing.npy"), "--kappa missing.npy: cannot read"),
    (_with(sigma="0.02,0.03,0.04"), "--sigma 0.02,0.03,0.04 has shape [3]: mismatched shapes"),
    (_with(sigma="sigma3.npy"), "--sigma sigma3.npy has shape [3]"),
    (_with(sigma="0.02,0"), "of bin 1 is 0"),
    (_with(sigma="0.03,-0.02"), "of bin 1 is -0.02"),
    (_with(sigma="a,b"), "comma-separated numbers"),
    (_with(mask="mask_small.npy"), "--mask mask_small.npy has shape [4, 4]: mismatched shapes"),
    (_with(mask="mask_none.npy"), "observes no pixel"),
    (_with(nz="nz_neg.npz"), "of bin 0 is negative"),
    (_with(nz="nz_zero.npz"), "integrates to 0"),
    (_with(nz="nz_flat_z.npz"), "strictly increasing"),
    (_with(nz="nz_wrong.npz"), "mismatched shapes"),
    (_with(nz="nz_keys.npz"), "'z' [N]"),
    (_with(nz="kappa.npy"), "needs an .npz"),
    ([a for a in BASE if a not in ("--nz", "nz.npz")] + ["--nz-txt", "bin0.txt"], "1 file(s)"),
    (_with(fov_deg="-1"), "--fov-deg is -1"),
    (_with(fov_deg="nan"), "--fov-deg is nan"),
    (BASE[:2], "required"),
])
def test_converter_bad_input_one_line_error_writes_nothing(tmp_path, monkeypatch, capsys, argv, needle):
    _bad_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    try:
        rc = convert([*argv, "--out", "out"])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "out").exists()


def test_converter_refuses_to_overwrite(tmp_path, monkeypatch, capsys):
    _inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert convert([*BASE, "--out", "out"]) == 0
    before = load_observation(tmp_path / "out").kappa_obs
    assert convert([*_with(sigma="0.05"), "--out", "out"]) == 2
    assert "exists" in capsys.readouterr().err
    np.testing.assert_array_equal(load_observation(tmp_path / "out").noise_sigma, [0.02, 0.03])  # untouched
    assert convert([*_with(sigma="0.05"), "--out", "out", "--overwrite"]) == 0
    np.testing.assert_array_equal(load_observation(tmp_path / "out").noise_sigma, [0.05, 0.05])
    np.testing.assert_array_equal(load_observation(tmp_path / "out").kappa_obs, before)


# ============================================================================ mocks


def test_mock_like_group_loads_with_truth(tmp_path):
    path, bins = mock_group(tmp_path / "run" / "mock.zarr")
    obs = load_observation(tmp_path / "run")
    assert obs.has_truth and obs.path == path and obs.seed == 3
    assert obs.truth == {"Omega_c": 0.26, "sigma8": 0.81} and obs.config["simulation"]["box"] == BOX
    assert obs.kappa_true.shape == obs.kappa_obs.shape == (NB, NPIX, NPIX) and obs.white_noise.shape == tuple(MESH)
    for got, made in zip(obs.nz_bins, bins):  # the bins that made it, bitwise (N_Z grid kept)
        assert got.z.dtype == made.z.dtype and got.n_gal == made.n_gal
        np.testing.assert_array_equal(got.z, made.z)
        np.testing.assert_array_equal(got.nz, made.nz)
    mesh = make_mesh((2, 2))
    sh = load_observation(path, mesh)
    assert sh.kappa_obs.sharding.spec == sh.kappa_true.sharding.spec == jax.sharding.PartitionSpec(None, "x", "y")
    assert sh.white_noise.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
        "x", "y")), 3)
    np.testing.assert_array_equal(np.asarray(sh.white_noise), obs.white_noise)
    m = load_mock(tmp_path / "run", mesh)  # the thin wrapper for existing callers
    np.testing.assert_array_equal(np.asarray(m.kappa_true), obs.kappa_true)
    check_observation(obs, analysis_cfg())


def test_mock_without_nz_tables_rebuilds_bins_from_its_config(tmp_path):
    """A mock written before nz_z/nz/fov_deg joined format 1: bins from its config.survey."""
    _, bins = mock_group(tmp_path / "old" / "mock.zarr", nz_tables=False)
    obs = load_observation(tmp_path / "old")
    assert obs.fov_deg == FOV
    for got, made in zip(obs.nz_bins, bins):
        np.testing.assert_array_equal(got.z, made.z)
        np.testing.assert_array_equal(got.nz, made.nz)


def test_observation_without_truth_is_not_a_mock(tmp_path):
    mock_group(tmp_path / "o" / "observation.zarr", drop=("kappa_true", "white_noise", "truth", "config"))
    obs = load_observation(tmp_path / "o")
    assert not obs.has_truth
    with pytest.raises(MockError, match=r"lacks \['kappa_true', 'white_noise', 'truth'\]"):
        load_mock(tmp_path / "o")


def test_write_mock_output_is_an_observation_with_truth(tmp_path, monkeypatch):
    """fli.mock.write_mock (figures stubbed out) gives a group that load_observation reads, with
    the n(z) of the bins that made it, bitwise."""
    from fli import mock as fli_mock

    monkeypatch.setattr(fli_mock, "make_figures", lambda run_dir, cfg, m: {})
    cfg = analysis_cfg()
    rng = np.random.default_rng(2)
    bins = nz_bins_from_config(cfg.survey)
    kt = rng.normal(0, 0.01, (NB, NPIX, NPIX)).astype(np.float32)
    geom = SimpleNamespace(plane_r=np.array([100.0, 200.0]), plane_a=np.array([0.9, 0.8]), n_used=2,
                           replication_note=lambda: "")
    m = dict(kappa_obs=kt + 0.01, kappa_true=kt, white_noise=rng.normal(size=MESH).astype(np.float32),
             noise_sigma=np.array([0.02, 0.03]), mask=None, bins=bins, geom=geom, a_steps=np.array([0.1, 1.0]),
             max_disp=0.5, forward_s=1.0)
    resolved = {"simulation": {"mesh": MESH, "box": BOX}, "lensing": {"npix": NPIX, "fov_deg": FOV}}
    path = fli_mock.write_mock(tmp_path / "run", cfg, resolved, m, logging.getLogger("test"))
    obs = load_observation(path.parent)
    assert obs.has_truth and obs.fov_deg == FOV and obs.attrs["npix"] == NPIX
    for got, made in zip(obs.nz_bins, bins):
        assert got.n_gal == made.n_gal
        np.testing.assert_array_equal(got.z, made.z)
        np.testing.assert_array_equal(got.nz, made.nz)
    check_observation(obs, cfg)


# ============================================================================ loader errors


@pytest.mark.parametrize("make,exc,needle", [
    (lambda p: p.mkdir(parents=True), MockError, "no observation at"),
    (lambda p: (mock_group(p / "mock.zarr"), (p / "mock.zarr" / COMPLETE).unlink()), MockError,
     "incomplete (no COMPLETE marker: the write was interrupted)"),
    (lambda p: (mock_group(p / "mock.zarr"), mock_group(p / "observation.zarr")), MockError, "holds both"),
    (lambda p: (mock_group(p / "mock.zarr"), (p / "mock.zarr" / "zarr.json").write_text("{")), MockError,
     "unreadable"),
    (lambda p: mock_group(p / "mock.zarr", drop=("kappa_obs",)), MockError, "lack ['kappa_obs']"),
    (lambda p: mock_group(p / "mock.zarr", drop=("noise_sigma",)), MockError, "lack ['noise_sigma']"),
    (lambda p: mock_group(p / "mock.zarr", drop=("nz", "config")), MockError, "lack ['nz']"),
    (lambda p: mock_group(p / "mock.zarr", drop=("units",)), MockError, "lack units"),
    (lambda p: mock_group(p / "mock.zarr", drop=("fov_deg", "config")), MockError, "lack fov_deg"),
    (lambda p: mock_group(p / "mock.zarr", drop=("fli_format",)), MockError, "lack fli_format"),
    (lambda p: mock_group(p / "mock.zarr", fli_format=2), ObservationError, "this fli reads format 1"),
    (lambda p: mock_group(p / "mock.zarr", noise_sigma=np.ones(3)), ObservationError,
     "noise_sigma has shape [3]: mismatched shapes, kappa_obs [2, 8, 8] needs [n_bins] = [2]"),
    (lambda p: mock_group(p / "mock.zarr", kappa_obs=np.zeros((2, 8, 4), np.float32)), ObservationError,
     "kappa_obs has shape [2, 8, 4]"),
    (lambda p: mock_group(p / "mock.zarr", kappa_obs=np.zeros((2, 8, 8), np.int32)), ObservationError,
     "dtype int32"),
    (lambda p: mock_group(p / "mock.zarr", kappa_true=np.zeros((1, 8, 8), np.float32)), ObservationError,
     "kappa_true has shape [1, 8, 8]"),
    (lambda p: mock_group(p / "mock.zarr", mask=np.ones((4, 4), bool)), ObservationError,
     "mask has shape [4, 4]: mismatched shapes"),
    (lambda p: mock_group(p / "mock.zarr", mask=np.full((8, 8), 2, np.int8)), ObservationError, "0/1"),
    (lambda p: mock_group(p / "mock.zarr", npix=16), ObservationError, "npix is 16"),
    (lambda p: mock_group(p / "mock.zarr", kappa_obs=np.full((2, 8, 8), np.nan, np.float32)), ObservationError,
     "kappa_obs has 128 non-finite pixel(s) of 128"),
    (lambda p: mock_group(p / "mock.zarr", noise_sigma=np.array([0.02, 0.0])), ObservationError,
     "noise_sigma of bin 1 is 0"),
    (lambda p: mock_group(p / "mock.zarr", noise_sigma=np.array([np.nan, 0.02])), ObservationError,
     "noise_sigma of bin 0 is nan"),
    (lambda p: mock_group(p / "mock.zarr", nz=-np.ones((2, N_Z))), ObservationError, "nz of bin 0 is negative"),
    (lambda p: mock_group(p / "mock.zarr", nz=np.zeros((2, N_Z))), ObservationError,
     "nz of bin 0 integrates to 0"),
    (lambda p: mock_group(p / "mock.zarr", nz=np.ones((3, N_Z))), ObservationError,
     "nz has shape [3, 512]: mismatched shapes"),
    (lambda p: mock_group(p / "mock.zarr", nz_z=np.zeros((2, N_Z))), ObservationError, "strictly increasing"),
    (lambda p: mock_group(p / "mock.zarr", fov_deg=-5.0), ObservationError, "fov_deg is -5.0"),
    (lambda p: mock_group(p / "mock.zarr", drop=("nz", "nz_z"), nz_tables=True,
                          config={"survey": {"bins": [{"z0": 0.5}]}}), ObservationError,
     "config.survey.bins has 1 bins: mismatched shapes"),
])
def test_bad_observations_give_one_line_errors(tmp_path, make, exc, needle):
    run = tmp_path / "run"
    make(run)
    with pytest.raises(exc) as e:
        load_observation(run)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg
    assert isinstance(e.value, (FileNotFoundError, ValueError))


# ============================================================================ against the config


@pytest.mark.parametrize("change,needle", [
    (dict(lensing=LensingConfig(npix=16, fov_deg=FOV)), ["lensing.npix = 16", "8 x 8", "lensing.npix=8"]),
    (dict(survey=SurveyConfig(bins=[NzBinConfig()])), ["survey.bins has 1 bin(s)", "has 2"]),
    (dict(lensing=LensingConfig(npix=NPIX, fov_deg=4.0)), ["lensing.fov_deg = 4", "covers 5 deg"]),
    (dict(simulation=SimulationConfig(mesh=[16, 16, 16], box=list(BOX), halo=2)),
     ["simulation.mesh = [16, 16, 16]", "white noise [8, 8, 16]"]),
    (dict(simulation=SimulationConfig(mesh=list(MESH), box=[300.0, 300.0, 2000.0], halo=2)),
     ["simulation.box = [300.0, 300.0, 2000.0]", "box [300.0, 300.0, 3200.0]"]),
])
def test_check_observation_refuses_each_mismatch(tmp_path, change, needle):
    mock_group(tmp_path / "run" / "mock.zarr")
    obs = load_observation(tmp_path / "run")
    with pytest.raises(ConfigError) as e:
        check_observation(obs, analysis_cfg(**change))
    for n in needle:
        assert n in str(e.value), str(e.value)


def test_check_observation_without_truth_ignores_the_simulation(tmp_path):
    mock_group(tmp_path / "o" / "observation.zarr", drop=("kappa_true", "white_noise", "truth", "config"))
    obs = load_observation(tmp_path / "o")
    check_observation(obs, analysis_cfg(simulation=SimulationConfig(mesh=[16, 16, 16], box=[1.0, 1.0, 1.0],
                                                                    halo=2)))
