"""Where theta starts from a fli-map run (fli/infer/sample/start.py ``start_theta``): its joint MAP,
its prior, or a draw of its MUSE estimate's Gaussian, against NumPy's moments of many draws."""

import json
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from fli.config import ConfigError

MEAN, COV = np.array([0.3, -0.8]), np.array([[0.04, -0.018], [-0.018, 0.09]])
MJ = {"params": {"Omega_c": 0.2, "sigma8": 1.07}, "muse": {"theta_z": MEAN.tolist(), "cov_z": COV.tolist()}}
POST = SimpleNamespace(prior=SimpleNamespace(n=2), theta_of=lambda p: np.array([p["Omega_c"], p["sigma8"]]) * 10)


def test_muse_draws_have_the_estimates_mean_and_covariance(tmp_path):
    from fli.infer.sample.start import start_theta

    keys = jax.random.split(jax.random.key(0), 4000)
    draws = np.array([start_theta("muse", MJ, tmp_path, POST, k, "map")[0] for k in keys])
    # 4000 draws: the mean's standard error is sd / 63; 4 of them
    se = np.sqrt(np.diag(COV) / len(draws))
    assert np.all(np.abs(draws.mean(0) - MEAN) < 4 * se), (draws.mean(0), MEAN)
    # a sample covariance of 4000 draws: relative error ~ sqrt(2 / 4000) = 2.2 % on the
    # variances; 10 % is 4.5 of those. The correlation -0.3 to within 0.06 (4 of its 0.015)
    c = np.cov(draws.T)
    np.testing.assert_allclose(np.diag(c), np.diag(COV), rtol=0.1)
    assert abs(c[0, 1] / np.sqrt(c[0, 0] * c[1, 1]) - (-0.3)) < 0.06


def test_the_field_and_the_choice(tmp_path):
    from fli.infer.sample.start import start_theta

    k = jax.random.key(1)
    # without a complete muse_field.zarr the chain takes the joint MAP's field
    assert start_theta("muse", MJ, tmp_path, POST, k, "map")[1] == "map_field.zarr"
    (tmp_path / "muse_field.zarr").mkdir()
    (tmp_path / "muse_field.zarr" / "COMPLETE").write_text(json.dumps({}))
    assert start_theta("muse", MJ, tmp_path, POST, k, "map")[1:] == ("muse_field.zarr", "muse")
    # auto: MUSE where the run has it, else the caller's default
    assert start_theta("auto", MJ, tmp_path, POST, k, "map")[2] == "muse"
    joint = {"params": MJ["params"]}
    theta, field, label = start_theta("auto", joint, tmp_path, POST, k, "map")
    assert label == "map" and field == "map_field.zarr" and np.allclose(theta, [2.0, 10.7])
    assert start_theta("auto", joint, tmp_path, POST, k, "prior")[2] == "prior"
    with pytest.raises(ConfigError, match="inference.init_theta=muse: .* holds no MUSE estimate"):
        start_theta("muse", joint, tmp_path, POST, k, "map")


def test_chains_from_the_prior_on_a_field_larger_than_tiny_are_warned_about(caplog):
    import logging
    from types import SimpleNamespace

    from fli.infer.sample.start import PRIOR_START_CELLS, warn_prior_start

    log = logging.getLogger("fli.test_start")

    def warned(shape, init):
        caplog.clear()
        post = SimpleNamespace(fwd=SimpleNamespace(grid=SimpleNamespace(shape=shape)))
        with caplog.at_level(logging.WARNING, logger="fli.test_start"):
            warn_prior_start(SimpleNamespace(init=init), post, log)
        return [r.getMessage() for r in caplog.records]

    assert PRIOR_START_CELLS == 16 * 16 * 64  # tiny's field, where chains from the prior were seen to arrive
    (msg,) = warned((32, 32, 128), None)  # mid size, the default init
    assert "init=prior on a field of 131072 cells" in msg and "init=<fli-map run dir>" in msg
    assert warned((32, 32, 128), "prior") and not warned((16, 16, 64), None) and not warned((32, 32, 128), "/a/map")
