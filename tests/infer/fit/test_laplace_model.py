"""The marginal Laplace error of the real posterior (PM forward, traced light cone, lensing)
against a brute-force one: the dense Hessian of a 4 x 4 x 8 field, inverted directly."""

import logging
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fli.infer.fit.map import laplace_errors
from fli.infer.posterior.model import Latents
from tests.helpers.posterior import small_posterior

FD_STEP = 1e-4


def _dense_hessian(grad, x, step=FD_STEP):
    """The Hessian by central differences of the jitted gradient ``grad`` at ``x``, column by
    column. Independent of the HVPs that fli's Laplace step differentiates (forward over
    reverse): only the gradient, and one compiled program (the reverse-over-reverse HVP that
    this test compiled before took 67 s of its 164 s). float64: the truncation error
    ``step^2 / 6 |U'''|`` and the round-off ``eps |grad| / step`` are both ~1e-9 of H here."""
    eye = np.eye(x.shape[0])
    cols = [(np.asarray(grad(x + step * e)) - np.asarray(grad(x - step * e))) / (2 * step) for e in eye]
    return np.stack(cols, axis=1)


# The exact Hessian only: it is what fli-map's default (hessian="auto") takes first. The
# Gauss-Newton variant's Schur algebra is checked against a dense inverse in
# tests/infer/fit/test_laplace.py, and its products J v, J^T u are the residual's JVP and VJP, which
# the model's finite-difference gradient tests and tests/sim/test_second_order.py check on
# the PM forward. Compiling is nearly all of its cost, and it does not shrink with the field.
# fli-map's own Laplace step (laplace_errors, what map.json's "laplace" holds) is what runs: the
# fli-map tests (tests/infer/fit/test_map.py) run without it, since its compile (~150 s in CI for
# their small posterior) would be paid twice.
@pytest.mark.slow(seconds=200)  # 147 s alone, cold; 200 s in the fresh-clone CI of 469bd9a
def test_schur_complement_matches_the_dense_inverse():
    with jax.enable_x64(True):
        post, data, lat = small_posterior((1, 1), dtype="float64", extra=[
            "simulation.mesh=[4,4,8]", "lensing.n_planes=2", "simulation.adjoint=reversible"])
        n, shape = post.prior.n, post.fwd.grid.shape

        def U_vec(v):
            return post.potential(Latents(v[:n], v[n:].reshape(shape)), data)

        x = jnp.concatenate([lat.theta, lat.s.reshape(-1)])
        H = _dense_hessian(jax.jit(jax.grad(U_vec)), x)
        assert np.max(np.abs(H - H.T)) < 1e-5 * np.abs(H).max()  # the differences are accurate
        H = 0.5 * (H + H.T)
        htt, hts, hss = H[:n, :n], H[:n, n:], H[n:, n:]
        schur = htt - hts @ np.linalg.solve(hss, hts.T)
        mcfg = SimpleNamespace(cg_tol=1e-10, cg_maxiter=2000)
        out = laplace_errors(post, data, lat, mcfg, logging.getLogger("test"))
        assert out["hessian"] == "exact" and out["positive_definite"] and all(out["cg_converged"])
        # the same covariances in physical units, through the prior transform's Jacobian
        jac = np.diag(np.asarray(post.prior.jacobian(lat.theta), float))  # independent priors
        cov_m = jac @ np.linalg.inv(schur) @ jac.T
        cov_c = jac @ np.linalg.inv(htt) @ jac.T
        # CG to 1e-10 relative residual: the Schur error is ~1e-10 x cond(H_ss); 1e-3 is the
        # issue's requirement with a wide margin, tight enough to catch a wrong block or sign;
        # the conditional one needs no solve: 1e-5 is the differences' accuracy with margin
        np.testing.assert_allclose(out["marginal"]["cov"], cov_m, rtol=1e-3, atol=1e-3 * np.abs(cov_m).max())
        np.testing.assert_allclose(out["conditional"]["cov"], cov_c, rtol=1e-5)
        for i, name in enumerate(post.names):
            assert out["marginal"]["std"][name] == pytest.approx(np.sqrt(cov_m[i, i]), rel=1e-3)
            # the field marginalised can only widen the error (Schur complement <= H_tt)
            assert out["marginal"]["std"][name] >= out["conditional"]["std"][name] * (1 - 1e-6)
        # the field matters: marginalising it changes the precision by more than the tolerance
        assert np.abs(schur - htt).max() > 1e-2 * np.abs(htt).max()
