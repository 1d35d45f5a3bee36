"""The field-level posterior: priors, the flat latent layout, the NumPyro model, layouts, HLO."""

import logging
import math
import re
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fli.cli.compose import compose
from fli.config import ConfigError
from fli.infer.posterior.layout import FlatLayout
from fli.infer.posterior.model import Latents, build_posterior
from fli.infer.posterior.priors import PriorTransform
from fli.sim.sharding import make_mesh, white_noise
from tests.helpers.posterior import SMALL, small_posterior
from tests.helpers.processes import run_workers


def test_prior_transforms_carry_the_standard_normal_onto_each_prior():
    pt = PriorTransform(("Omega_c", "sigma8", "n_s"), ("uniform", "normal", "truncated_normal"),
                        (0.1, 0.0, 0.9), (0.5, 1.0, 1.0), (0.0, 0.8, 0.96), (1.0, 0.1, 0.05))
    u = np.linspace(0.01, 0.99, 25)
    z = stats.norm.ppf(u)
    x = np.asarray(jax.vmap(pt)(jnp.asarray(np.stack([z] * 3, -1), jnp.float32)))
    # quantiles of each prior (scipy as the independent reference); float32 -> 1e-5
    np.testing.assert_allclose(x[:, 0], stats.uniform(0.1, 0.4).ppf(u), rtol=1e-5)
    np.testing.assert_allclose(x[:, 1], stats.norm(0.8, 0.1).ppf(u), rtol=1e-5)
    tn = stats.truncnorm((0.9 - 0.96) / 0.05, (1.0 - 0.96) / 0.05, loc=0.96, scale=0.05)
    np.testing.assert_allclose(x[:, 2], tn.ppf(u), rtol=1e-5)
    back = np.stack([pt.inverse(row) for row in x[::6].astype(float)])
    np.testing.assert_allclose(back, np.stack([z] * 3, -1)[::6], atol=2e-4)  # float32 forward values
    with pytest.raises(ConfigError, match="prior.params.Omega_c"):
        pt.inverse([0.6, 0.8, 0.95])


@pytest.mark.parametrize("pdims", [(1, 1), (2, 4)])
def test_flat_layout_round_trip(pdims):
    mesh = make_mesh(pdims)
    lay = FlatLayout((8, 8, 6), mesh, 2)
    assert lay.size % lay.n_devices == 0 and lay.size == 8 * 8 * 6 + lay.n_devices * 2
    assert lay.n_dummies == lay.n_devices * 2 - 2
    s = white_noise(3, (8, 8, 6), mesh)
    theta = jnp.asarray([0.3, -1.2], jnp.float32)
    flat = jax.jit(lay.pack)(theta, s)
    assert flat.sharding.is_equivalent_to(lay.sharding, 1)
    th, s2 = jax.jit(lay.unpack)(flat)
    np.testing.assert_array_equal(np.asarray(th), np.asarray(theta))
    np.testing.assert_array_equal(np.asarray(s2), np.asarray(s))
    # the field block of device (i, j) is the slice i * py + j: a local reshape, no reordering
    px, py = pdims
    bx, by = 8 // px, 8 // py
    host = np.asarray(flat).reshape(px * py, -1)
    i, j = px - 1, py - 1
    np.testing.assert_array_equal(host[i * py + j, : bx * by * 6].reshape(bx, by, 6),
                                  np.asarray(s)[i * bx:(i + 1) * bx, j * by:(j + 1) * by])
    assert float(np.sum(np.asarray(lay.dummy_mask()))) == lay.n_dummies


@pytest.mark.slow(seconds=30)
def test_numpyro_model_is_the_same_posterior():
    """NumPyro's potential energy of the model = U on the flat layout + its constants."""
    from numpyro.infer.util import potential_energy

    post, data, lat = small_posterior((2, 2))
    lay = post.layout
    key = jax.random.key(7)
    dummies = jax.random.normal(key, (lay.size,))
    flat = lay.pack(lat.theta + 0.1, lat.s * 0.9, dummies)
    u = float(jax.jit(post.potential_flat)(flat, data))
    pe = float(jax.jit(lambda f, d: potential_energy(post.numpyro_model, (d,), {}, {"latent": f}))(flat, data))
    n_pix = int(np.prod(post.fwd.kappa_shape))
    sigma = np.asarray(data.sigma, float)
    const = 0.5 * math.log(2 * math.pi) * (lay.size + n_pix) + (n_pix / len(sigma)) * np.sum(np.log(sigma))
    # float32 sums of ~1e4 terms of order 1: relative 1e-5 of the total
    assert pe == pytest.approx(u + const, rel=1e-5)
    # the dummies enter the prior only
    u0 = float(jax.jit(post.potential)(Latents(lat.theta + 0.1, lat.s * 0.9), data))
    th, _ = lay.unpack(flat)
    extra = 0.5 * float(jnp.sum((flat * lay.dummy_mask()) ** 2))
    assert u == pytest.approx(u0 + extra, rel=1e-6)
    assert float(th[0]) == pytest.approx(float(lat.theta[0]) + 0.1, rel=1e-6)


def _collectives(hlo: str):
    """(op, element count of its result) for every all-gather / all-reduce / all-to-all."""
    from fli.sim.sharding import hlo_collectives

    return list(hlo_collectives(hlo).elements())


@pytest.mark.slow(seconds=30)  # (an 8-device PM gradient compiled and its HLO read)
def test_value_and_grad_gathers_no_field():
    """The compiled value-and-gradient on 8 devices: no all-gather / all-reduce of field size.

    Field size is nx * ny * nz; the forward's own collectives are the FFT's all-to-alls (of
    local blocks), the halo permutes and the plane/map gathers (2D). Counted here exactly.
    """
    post, data, lat = small_posterior((2, 4))
    flat = post.layout.pack(lat.theta, lat.s)
    hlo = jax.jit(jax.value_and_grad(post.potential_flat)).lower(flat, data).compile().as_text()
    ops = _collectives(hlo)
    field = post.fwd.grid.n_cells
    big = [(op, n) for op, n in ops if op in ("all-gather", "all-reduce") and n >= field // 8]
    assert big == [], big
    gathers = [n for op, n in ops if op == "all-gather"]
    assert gathers and max(gathers) <= 8 * 8  # one lens plane [nx, ny] at most
    # scalars (sums), the latents' tail and the gradient of the Born weights [n_bins, n_planes]
    reduces = [n for op, n in ops if op == "all-reduce"]
    assert max(reduces) <= max(post.layout.n_tail, post.fwd.n_bins * post.fwd.geometry.n_used)
    assert any(op == "all-to-all" for op, _ in ops)  # the pencil FFT is there: the parse works


@pytest.fixture(scope="module")
def one_device_value_and_grad():
    post, data, lat = small_posterior((1, 1))
    (u, _), g = post.value_and_grad()(lat, data)
    return float(u), np.asarray(g.theta), np.asarray(g.s)


def _assert_same_value_and_grad(u, g_theta, g_s, ref):
    u0, gt0, gs0 = ref
    # float32: sums in another order; U ~ 1e3 -> 1e-5 relative, gradients to 1e-4 of their scale
    assert u == pytest.approx(u0, rel=1e-5)
    np.testing.assert_allclose(g_theta, gt0, rtol=1e-3, atol=1e-4 * np.abs(gt0).max())
    np.testing.assert_allclose(g_s, gs0, atol=1e-4 * np.abs(gs0).max())


@pytest.mark.slow(seconds=45)  # with its one-device reference; the mock layout test stays default
@pytest.mark.parametrize("pdims", [(2, 2), (2, 4)])
def test_log_density_and_gradient_agree_across_layouts(pdims, one_device_value_and_grad):
    post, data, lat = small_posterior(pdims)
    (u, _), g = post.value_and_grad()(lat, data)
    _assert_same_value_and_grad(float(u), np.asarray(g.theta), np.asarray(g.s), one_device_value_and_grad)


@pytest.mark.multiprocess
# tests/test_forward_multiprocess.py keeps a 2-process run in the default set
@pytest.mark.slow(seconds=85)  # 83 s in the fresh-clone CI of 469bd9a
def test_log_density_and_gradient_on_two_processes(tmp_path, one_device_value_and_grad):
    """2 processes x 2 CPU devices (gloo), pdims (2, 2), against one device in this process."""
    out = tmp_path / "vg.npz"
    run_workers("mp_posterior_worker", out)
    got = np.load(out)
    _assert_same_value_and_grad(float(got["u"]), got["g_theta"], got["g_s"], one_device_value_and_grad)


@pytest.mark.slow(seconds=70)  # (68 s in CI) FD of kappa through PM (test_lensing_forward) stays in the default set
def test_posterior_gradient_matches_finite_differences_in_float64():
    """dU/dtheta for each sampled parameter and dU/ds along a white-noise direction: the
    finite differences recompute everything, the traced light cone included."""
    with jax.enable_x64(True):
        post, data, lat = small_posterior((2, 2), extra=["simulation.adjoint=reversible"], dtype="float64")
        (_, _), g = post.value_and_grad()(lat, data)
        f = jax.jit(post.potential)
        v = white_noise(9, post.fwd.grid.shape, post.fwd.grid.mesh, dtype=jnp.float64)
        # central differences in float64, round-off ~1e-16 |U| / eps. The steps are small because
        # CIC is piecewise linear in the positions: a step that carries a particle across a cell
        # edge shifts the difference. Measured (theta): 3% at 1e-5, 4e-7 at 1e-6, and round-off
        # takes over below (2e-6 at 1e-7 on dU/dOmega_c ~ 0.06). Along s (g.v ~ -58) the difference
        # is 3e-4 off at 1e-6 (one crossing), 2e-8 at 1e-7 and 2e-7 at 1e-8, so s takes 1e-7
        eps = 1e-6
        for i in range(post.prior.n):
            e = jnp.zeros(post.prior.n).at[i].set(eps)
            fd = (f(Latents(lat.theta + e, lat.s), data) - f(Latents(lat.theta - e, lat.s), data)) / (2 * eps)
            assert float(g.theta[i]) == pytest.approx(float(fd), rel=1e-5)
        eps = 1e-7
        fd = (f(Latents(lat.theta, lat.s + eps * v), data) - f(Latents(lat.theta, lat.s - eps * v), data)) / (2 * eps)
        assert float(jnp.sum(g.s * v)) == pytest.approx(float(fd), rel=1e-5)


def test_a_prior_that_breaks_the_light_cone_is_refused():
    cfg, _ = compose([*SMALL, "prior.params.Omega_c.low=0.08"])
    with pytest.raises(ConfigError, match=r"prior corner \(Omega_c = 0.08.*simulation.box\[2\].*"
                                          r"prior.params.Omega_c.low = 0\.1[0-9]* would fit"):
        build_posterior(cfg)
    cfg, _ = compose([*SMALL, "simulation.box=[200.0,200.0,3600.0]"])
    with pytest.raises(ConfigError, match="fov_deg = 5 spans .* > min\\(Lx, Ly\\) = 200"):
        build_posterior(cfg)


def test_bad_priors_are_refused_with_their_key():
    for over, key in [("prior.params.sigma8.low=1.5", "prior.params.sigma8.low/high"),
                      ("prior.sample=[Omega_c,sigma9]", "prior.sample"),
                      ("prior.params.sigma8.dist=normal prior.params.sigma8.scale=-1", "prior.params.sigma8.scale")]:
        with pytest.raises(ConfigError, match=re.escape(key)):
            compose([*SMALL, *over.split()])


def test_misspecified_fixed_parameters_are_named(caplog):
    cfg, _ = compose(SMALL)
    obs = SimpleNamespace(nz_bins=None, truth={"Omega_c": 0.25, "sigma8": 0.8, "h": 0.7, "n_s": 0.9665,
                                               "Omega_b": 0.049, "w0": -1.0, "wa": 0.0})
    from fli.lensing.survey import nz_bins_from_config

    obs.nz_bins = nz_bins_from_config(cfg.survey)
    with caplog.at_level(logging.WARNING, logger="fli"):
        build_posterior(cfg, obs)
    msgs = [r.getMessage() for r in caplog.records if "misspecified" in r.getMessage()]
    assert len(msgs) == 1 and "h is fixed at cosmology.h = 0.6766" in msgs[0] and "0.7" in msgs[0]
