"""The marginal Laplace error of the real posterior (PM forward, traced light cone, lensing)
against a brute-force one: the dense Hessian of an 8 x 8 x 16 field, inverted directly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fli.infer.laplace import laplace
from fli.infer.model import Latents
from tests.helpers.posterior import small_posterior


def _dense(fn_vec, n, dim):
    """Dense matrix of a linear map R^dim -> R^dim given by ``fn_vec(e)``, column by column."""
    eye = jnp.eye(dim)
    return np.asarray(jax.lax.map(fn_vec, eye)).T


@pytest.mark.slow(seconds=185)  # a dense 1026 x 1026 Hessian by reverse-over-reverse columns: compiling is most of it
@pytest.mark.parametrize("hessian", ["exact", "gauss_newton"])
def test_schur_complement_matches_the_dense_inverse(hessian):
    with jax.enable_x64(True):
        post, data, lat = small_posterior((1, 1), extra=["simulation.mesh=[8,8,16]", "simulation.adjoint=reversible"],
                                          dtype="float64")
        n, shape = post.prior.n, post.fwd.grid.shape
        dim = n + int(np.prod(shape))

        def split(v):
            return v[:n], v[n:].reshape(shape)

        def U(th, s):
            return post.potential(Latents(th, s), data)

        def U_vec(v):
            return U(*split(v))

        def res_vec(v):
            return post.residual(Latents(*split(v)), data).reshape(-1)

        x = jnp.concatenate([lat.theta, lat.s.reshape(-1)])
        if hessian == "exact":
            g = jax.grad(U_vec)
            H = _dense(jax.jit(lambda e: jax.grad(lambda y: jnp.vdot(g(y), e))(x)), n, dim)
        else:
            J = np.asarray(jax.jacrev(res_vec)(x))
            H = J.T @ J + np.eye(dim)
        H = 0.5 * (H + H.T)
        htt, hts, hss = H[:n, :n], H[:n, n:], H[n:, n:]
        schur = htt - hts @ np.linalg.solve(hss, hts.T)
        res = laplace(U, lat.theta, lat.s, residual=lambda th, s: post.residual(Latents(th, s), data),
                      cg_tol=1e-10, cg_maxiter=2000, hessian=hessian)
        assert res.hessian == hessian
        # CG to 1e-10 relative residual: the Schur error is ~1e-10 x cond(H_ss); 1e-3 is the
        # issue's requirement with a wide margin, tight enough to catch a wrong block or sign
        np.testing.assert_allclose(res.precision_marginal, schur, rtol=1e-3, atol=1e-3 * np.abs(schur).max())
        np.testing.assert_allclose(res.precision_conditional, htt, rtol=1e-6)
        # the field matters: marginalising it changes the precision by more than the tolerance
        assert np.abs(schur - htt).max() > 1e-2 * np.abs(htt).max()
