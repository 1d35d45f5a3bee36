"""Laplace error with the field marginalised: CG over pytrees, HVPs, Schur complement.

The reference is a dense Hessian of a problem small enough to form it (field 8x8x16 = 1024
cells, n = 3 parameters): ``jax.hessian`` of U on the flattened latent vector, the exact Schur
complement with numpy. The toy residual is nonlinear and couples theta and s the way the PM
model does: an amplitude ``exp(0.3 theta_0)`` times a line-of-sight tilt ``exp(theta_1 z)``
times a fixed transverse smoothing of the field, projected onto three 2D maps by fixed
line-of-sight kernels, plus a quadratic term whose coefficient depends on ``theta_2``, masked
and whitened (see :func:`_model`). Most checks are at its MAP, where the exact Hessian is PD.
"""

from __future__ import annotations

import copy
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fli.infer.fit.hvp import HVP_COST, cg, exact_hvp, gauss_newton_hvp
from fli.infer.fit.laplace import laplace, schur_columns, to_physical
from fli.sim.sharding import field_sharding, make_mesh, white_noise

SHAPE = (8, 8, 16)
N_THETA = 3
N_MAPS = 3
THETA_TRUE = np.array([0.2, -0.3, 0.1])


# --------------------------------------------------------------------------- toy problem


@jax.custom_vjp
def _square_cvjp(m):
    return m * m


# The forward rule calls the primal, as fli.sim.painting's do: that is what makes JAX refuse
# forward mode over the gradient (a rule computing m * m itself would be differentiated).
_square_cvjp.defvjp(lambda m: (_square_cvjp(m), m), lambda m, g: (2.0 * m * g,))


def _model(theta, s, p, custom_vjp=False):
    """Maps ``[N_MAPS, nx, ny]`` from a field ``[nx, ny, nz]`` (sharded ``P('x','y')``).

    ``f = amp(theta_0) tilt(theta_1, z) (s + b (shift_x s + shift_y s))``: an amplitude
    ``exp(0.3 theta_0)`` (sigma_8-like), a line-of-sight tilt ``exp(theta_1 z)`` (growth-like,
    a separable filter) and a fixed transverse smoothing (a neighbour exchange on the mesh);
    ``m = W . f`` (fixed line-of-sight kernels), minus half its map mean; then
    ``m + c0 exp(0.2 theta_2) m^2``."""
    dt = s.dtype
    zc = jnp.asarray(p["z"], dt)
    f = jnp.exp(0.3 * theta[0]) * jnp.exp(theta[1] * zc) * (s + 0.2 * (jnp.roll(s, 1, 0) + jnp.roll(s, 1, 1)))
    m = jnp.moveaxis(jnp.tensordot(f, jnp.asarray(p["w"], dt), axes=([2], [1])), 2, 0)
    m = m - 0.5 * jnp.mean(m, axis=(1, 2), keepdims=True)
    sq = _square_cvjp(m) if custom_vjp else m * m
    return m + p["c0"] * jnp.exp(0.2 * theta[2]) * sq


def _residual(theta, s, p, custom_vjp=False):
    dt = s.dtype
    mask, data = jnp.asarray(p["mask"], dt), jnp.asarray(p["data"], dt)
    return mask * (_model(theta, s, p, custom_vjp) - data) / p["sigma"]


def _potential(theta, s, p, custom_vjp=False):
    r = _residual(theta, s, p, custom_vjp)
    return 0.5 * (jnp.sum(r * r) + jnp.sum(theta * theta) + jnp.sum(s * s))


def _unflatten(v):
    return v[:N_THETA], v[N_THETA:].reshape(SHAPE)


# Dense references on the flattened latent [n + 1024] (float64, one device); the toy's
# arrays are arguments, so every toy shares one compilation.
_dense_hessian = jax.jit(jax.hessian(lambda v, p: _potential(*_unflatten(v), p)))
_dense_jacobian = jax.jit(jax.jacfwd(lambda v, p: _residual(*_unflatten(v), p).ravel()))
_value_and_grad = jax.jit(jax.value_and_grad(lambda v, p: _potential(*_unflatten(v), p)))


class Toy:
    """``r = mask (m + c m^2 - data) / sigma`` (see :func:`_model`) and
    ``U = |r|^2/2 + |theta|^2/2 + |s|^2/2``. The data are the model at (THETA_TRUE, a unit
    normal field) plus noise. ``v_true`` is that point (flattened [n + 1024]), ``v`` the MAP
    (L-BFGS on the float64 problem). ``custom_vjp`` computes ``m^2`` through a
    ``jax.custom_vjp`` (as the PM model's painting does), which forward mode refuses."""

    def __init__(self, custom_vjp=False, c0=0.3, sigma=0.1, seed=0):
        nx, ny, nz = SHAPE
        self.custom_vjp = custom_vjp
        zc = np.arange(nz) + 0.5
        mu = np.linspace(0.3, 0.8, N_MAPS) * nz
        w = np.exp(-0.5 * ((zc[None, :] - mu[:, None]) / (0.15 * nz)) ** 2)
        mask = np.ones((nx, ny))
        mask[1:3, 4:7] = 0.0
        rng = np.random.default_rng(seed)
        s_true = rng.standard_normal(SHAPE)
        p = {"z": zc / nz - 0.5, "w": w / w.sum(1, keepdims=True), "mask": mask, "c0": c0, "sigma": sigma,
             "data": np.zeros((N_MAPS, nx, ny))}
        with jax.enable_x64(True):
            m = np.asarray(_model(jnp.asarray(THETA_TRUE), jnp.asarray(s_true), p))
        p["data"] = m + sigma * rng.standard_normal(m.shape)
        self.p = p
        self.v_true = np.concatenate([THETA_TRUE, s_true.ravel()])
        import scipy.optimize  # noqa: PLC0415

        with jax.enable_x64(True):
            fg = lambda v: tuple(np.asarray(a, np.float64) for a in _value_and_grad(jnp.asarray(v), p))
            sol = scipy.optimize.minimize(fg, self.v_true, jac=True, method="L-BFGS-B",
                                          options={"gtol": 1e-9, "ftol": 1e-15, "maxiter": 3000})
        self.v = sol.x

    def U(self, theta, s):
        return _potential(theta, s, self.p, self.custom_vjp)

    def residual(self, theta, s):
        return _residual(theta, s, self.p, self.custom_vjp)

    def dense_hessian(self, v=None):
        with jax.enable_x64(True):
            return np.asarray(_dense_hessian(jnp.asarray(self.v if v is None else v), self.p))

    def dense_gauss_newton(self, v=None):
        with jax.enable_x64(True):
            jac = np.asarray(_dense_jacobian(jnp.asarray(self.v if v is None else v), self.p))
        return jac.T @ jac + np.eye(jac.shape[1])


def dense_schur(h):
    """``H_tt - H_ts H_ss^{-1} H_st`` and ``H_tt`` from a dense Hessian (float64)."""
    n = N_THETA
    htt, hts, hss = h[:n, :n], h[:n, n:], h[n:, n:]
    return htt - hts @ np.linalg.solve(hss, hts.T), htt


def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


@pytest.fixture(scope="module")
def mesh():
    return make_mesh((2, 2))


def sharded_point(toy, mesh, dtype, v=None):
    """A point of the toy (default its MAP) as (theta [n], s sharded P('x','y')), in ``dtype``."""
    theta, s = _unflatten(np.asarray(toy.v if v is None else v, dtype))
    return jnp.asarray(theta), jax.device_put(s, field_sharding(mesh))


@pytest.fixture(scope="module")
def toy64():
    return Toy()


@pytest.fixture(scope="module")
def dense64(toy64):
    return toy64.dense_hessian(), toy64.dense_gauss_newton()


@pytest.fixture(scope="module")
def exact64(toy64, mesh):
    with jax.enable_x64(True):
        theta, s = sharded_point(toy64, mesh, np.float64)
        return laplace(toy64.U, theta, s, residual=toy64.residual, hessian="exact", cg_tol=1e-10)


# --------------------------------------------------------------------------- CG


def test_cg_matches_dense_solve_on_pytree():
    # A random SPD operator on a pytree {a: [4], b: [3, 5]} (19 unknowns), condition 10.5.
    rng = np.random.default_rng(1)
    m = rng.standard_normal((19, 19))
    a_mat = m @ m.T / 19 + 0.3 * np.eye(19)
    b_flat = rng.standard_normal(19)
    unflat = lambda v: {"a": v[:4], "b": v[4:].reshape(3, 5)}
    flat = lambda t: jnp.concatenate([t["a"], t["b"].ravel()])
    with jax.enable_x64(True):
        am = jnp.asarray(a_mat)
        matvec = lambda t: unflat(am @ flat(t))
        x, info = jax.jit(lambda b: cg(matvec, b, tol=1e-12, maxiter=200))(unflat(jnp.asarray(b_flat)))
        x = np.asarray(flat(x))
    ref = np.linalg.solve(a_mat, b_flat)
    # tol 1e-12 on the residual: the solution error is <= cond(A) * 1e-12 ~ 1e-10.
    assert rel(x, ref) < 1e-9
    assert bool(info.converged) and not bool(info.negative_curvature)
    # 19 unknowns: CG converges in <= 19 steps in exact arithmetic; rounding adds a few.
    assert 5 <= int(info.iterations) <= 30
    true_res = np.linalg.norm(b_flat - a_mat @ x) / np.linalg.norm(b_flat)
    assert float(info.relative_residual) <= 1e-12
    assert true_res < 1e-10  # recursive and true residuals agree to rounding (~ cond * eps)


def test_cg_edge_cases_and_sharded_field(mesh):
    d = jnp.asarray([1.0, 2.0, 4.0])
    diag = lambda x: d * x
    # b = 0: x = 0 after no matvec.
    x, info = cg(diag, jnp.zeros(3))
    assert int(info.iterations) == 0 and bool(info.converged) and float(np.abs(x).max()) == 0.0
    # Start at the solution: no iteration needed.
    b = jnp.asarray([1.0, 1.0, 1.0])
    x, info = cg(diag, b, x0=b / d)
    assert int(info.iterations) == 0 and bool(info.converged)
    # maxiter reached before convergence (3 distinct eigenvalues need 3 steps).
    x, info = cg(diag, b, maxiter=2, tol=1e-6)
    assert int(info.iterations) == 2 and not bool(info.converged) and float(info.relative_residual) > 1e-6
    # Indefinite operator: flagged, not converged.
    x, info = cg(lambda x: jnp.asarray([1.0, -2.0, 3.0]) * x, b)
    assert bool(info.negative_curvature) and not bool(info.converged)
    # A diagonal SPD operator on a field sharded P('x','y'): exact to float32 rounding (1e-5
    # relative at tol 1e-6), and the solution keeps the field's sharding.
    s = white_noise(3, SHAPE, mesh)
    dfield = 1.5 + jnp.tanh(s)
    x, info = jax.jit(lambda b, dd: cg(lambda v: dd * v, b, tol=1e-6))(s, dfield)
    assert rel(x, s / dfield) < 1e-5 and bool(info.converged)
    assert x.sharding.is_equivalent_to(field_sharding(mesh), 3)


# --------------------------------------------------------------------------- Schur vs dense


def test_exact_schur_matches_dense_float64(toy64, dense64, exact64):
    h, _ = dense64
    np.linalg.cholesky(h)  # precondition: at the MAP the whole Hessian is PD (raises if not)
    schur, htt = dense_schur(h)
    res = exact64
    assert res.hessian == "exact" and res.fallback_reason is None and res.positive_definite
    assert res.ad == "forward"
    # float64, CG tol 1e-10: the solve error is at most tol * cond(H_ss) (cond ~ 870 here),
    # ~ 1e-7, which bounds the Schur error; measured 5e-10. H_tt is one HVP: rounding only.
    assert rel(res.precision_marginal, schur) < 1e-7
    assert rel(res.precision_conditional, htt) < 1e-12
    assert rel(res.cov_marginal, np.linalg.inv(schur)) < 1e-7
    assert rel(res.std_marginal, np.sqrt(np.diag(np.linalg.inv(schur)))) < 1e-7
    assert res.schur_asymmetry < 1e-8
    assert np.all(res.cg_converged) and np.all(res.cg_residual <= 1e-10)
    assert res.n_hvp == int(np.sum(2 + res.cg_iterations))
    assert res.cost_grad_evals == HVP_COST * res.n_hvp
    # H_ss is 1024-dimensional but only the 174 data directions (3 maps x 58 unmasked pixels)
    # differ from the identity: CG needs far fewer steps (measured 68-79).
    assert np.all(res.cg_iterations < 200)


@pytest.fixture(scope="module")
def counted_residual(toy64):
    """The toy residual and a counter of the times JAX traces it."""
    traces = [0]

    def residual(theta, s):
        traces[0] += 1
        return toy64.residual(theta, s)

    return residual, traces


def test_gauss_newton_schur_matches_dense_float64(toy64, dense64, exact64, counted_residual, mesh):
    h, hgn = dense64
    schur_gn, htt_gn = dense_schur(hgn)
    residual, traces = counted_residual
    with jax.enable_x64(True):
        theta, s = sharded_point(toy64, mesh, np.float64)
        before = traces[0]
        res = laplace(toy64.U, theta, s, residual=residual, hessian="gauss_newton", cg_tol=1e-10)
        first = traces[0] - before
        again = laplace(toy64.U, theta, s, residual=residual, hessian="gauss_newton", cg_tol=1e-8)
    # One program for all columns and CG iterations (~200 HVPs here): the residual is traced
    # once, at the program's one HVP site (three sites compiled the model three times), or
    # not at all if an earlier test compiled the program, and a second call, even with another
    # tolerance, reuses it.
    assert res.n_hvp > 150 and first == (1 if before == 0 else 0) and traces[0] == before + first
    assert again.n_hvp < res.n_hvp  # the looser tolerance took effect without a retrace
    assert res.hessian == "gauss_newton" and res.requested == "gauss_newton" and res.positive_definite
    # Same tolerances and reasons as for the exact Hessian.
    assert rel(res.precision_marginal, schur_gn) < 1e-7
    assert rel(res.precision_conditional, htt_gn) < 1e-12
    # The problem is nonlinear enough that GN and exact differ well beyond those tolerances.
    assert rel(res.precision_marginal, exact64.precision_marginal) > 1e-3


def test_float32_sharded_matches_dense(toy64, dense64, mesh):
    # The production setting: a float32 field on the (2, 2) mesh, default hessian "auto"; the
    # same problem and point (cast to float32) as the float64 reference.
    theta, s = sharded_point(toy64, mesh, np.float32)
    res = laplace(toy64.U, theta, s, residual=toy64.residual, cg_tol=1e-5)
    schur, htt = dense_schur(dense64[0])
    assert res.hessian == "exact" and res.fallback_reason is None
    # float32: rounding in x_j is ~ eps (6e-8) * cond(H_ss) (870) ~ 5e-5 and CG stops at a
    # relative residual of 1e-5: together ~1e-4 on the Schur complement (measured 2e-5), so 3e-4.
    # H_tt is one HVP: float32 rounding of 1024-cell sums, ~ 1e-6 (measured 5e-7).
    assert rel(res.precision_marginal, schur) < 3e-4
    assert rel(res.precision_conditional, htt) < 1e-5
    assert rel(res.std_marginal, np.sqrt(np.diag(np.linalg.inv(schur)))) < 3e-4
    assert np.all(res.cg_converged) and np.all(res.cg_residual <= 1e-5)


def test_marginal_variance_exceeds_conditional(exact64):
    res = exact64
    # Marginalising over a correlated field can only widen: cov_marg - cov_cond is PSD
    # (the Schur complement is <= H_tt in the Loewner order). 1e-10 relative: float64 rounding.
    diff = res.cov_marginal - res.cov_conditional
    assert np.linalg.eigvalsh(diff).min() > -1e-10 * np.abs(res.cov_marginal).max()
    assert np.all(res.std_marginal >= res.std_conditional)
    # theta_0 scales the field's amplitude and theta_1 tilts it along the line of sight: both
    # are nearly degenerate with s, so their marginal errors are much larger than the
    # conditional ones (measured ratios 8.1 and 8.5; 4 is a loose floor).
    assert np.all(res.std_marginal[:2] > 4 * res.std_conditional[:2])


# --------------------------------------------------------------------------- fallback


# Three points away from the MAP where the exact Hessian is not PD, one per detection path (the
# quadratic term's curvature r * d^2 r is what breaks it). At the truth (MAP theta_0 is 4.4,
# truth 0.2) H_tt and H_ss are PD but the Schur complement is not: only the Schur check sees
# it. At (theta_map, -s_map) H_ss is indefinite (CG meets negative curvature) while H_tt is PD.
# With theta = 0 and a uniform field of -1, m + c m^2 sits near its minimum, r < 0 and J ~ 0:
# H_tt itself is indefinite.
_NOT_PD_POINTS = {
    "truth": (lambda toy: toy.v_true, "Schur complement is not positive definite"),
    "minus_s_map": (lambda toy: np.concatenate([toy.v[:N_THETA], -toy.v[N_THETA:]]), "negative curvature"),
    "uniform": (lambda toy: np.concatenate([np.zeros(N_THETA), np.full(math.prod(SHAPE), -1.0)]),
                "H_tt is not positive definite"),
}


@pytest.mark.parametrize("where", list(_NOT_PD_POINTS))
def test_auto_falls_back_to_gauss_newton_where_not_pd(toy64, counted_residual, mesh, where):
    point, expected = _NOT_PD_POINTS[where]
    v = point(toy64)
    h = toy64.dense_hessian(v)
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.cholesky(h)  # precondition: the exact Hessian is not PD here
    schur_gn, htt_gn = dense_schur(toy64.dense_gauss_newton(v))
    with jax.enable_x64(True):
        theta, s = sharded_point(toy64, mesh, np.float64, v)
        # The same callables as above: the compiled programs are reused.
        res = laplace(toy64.U, theta, s, residual=counted_residual[0], hessian="auto", cg_tol=1e-10)
        with pytest.warns(UserWarning, match="not positive definite"):
            bare = laplace(toy64.U, theta, s, hessian="auto", cg_tol=1e-10)
    assert res.requested == "auto" and res.hessian == "gauss_newton" and res.positive_definite
    assert res.fallback_reason is not None and expected in res.fallback_reason
    # The GN numbers are those of the dense J^T J + I (tolerances as in the float64 GN test).
    assert rel(res.precision_marginal, schur_gn) < 1e-7
    assert rel(res.precision_conditional, htt_gn) < 1e-12
    assert np.all(res.cg_converged)
    # The exact attempt is counted: more HVPs than the GN columns alone.
    assert res.n_hvp > int(np.sum(2 + res.cg_iterations))
    assert res.cost_grad_evals == HVP_COST * res.n_hvp
    # Without a residual there is nothing to fall back to: exact, flagged.
    assert bare.hessian == "exact" and not bare.positive_definite and bare.fallback_reason is None


def test_custom_vjp_model_uses_reverse_mode(toy64, dense64, mesh):
    # The same problem with m^2 through a jax.custom_vjp (as fli.sim.painting): forward mode is
    # refused, so "auto" derivatives take reverse-over-reverse. The Gauss-Newton path is the
    # cheaper one to compile; the exact reverse HVP is checked against the dense Hessian in
    # test_hvps_match_dense_products. Tolerance as in the float64 GN test.
    toy = copy.copy(toy64)
    toy.custom_vjp = True
    schur_gn, _ = dense_schur(dense64[1])
    with jax.enable_x64(True):
        theta, s = sharded_point(toy, mesh, np.float64)
        with pytest.raises(TypeError, match="custom_vjp"):
            exact_hvp(toy.U, theta, s, theta, s, ad="forward")
        res = laplace(toy.U, theta, s, residual=toy.residual, hessian="gauss_newton", cg_tol=1e-10)
    assert res.ad == "reverse"
    assert rel(res.precision_marginal, schur_gn) < 1e-7


def test_hvps_match_dense_products(toy64, dense64, mesh):
    # The reverse exact HVP and the forward Gauss-Newton one against the dense matrices times
    # a random vector (float64: one product, rounding only -> 1e-11). The forward exact one is
    # checked through laplace above, the reverse Gauss-Newton one in the custom_vjp test.
    h, hgn = dense64
    rng = np.random.default_rng(5)
    v = rng.standard_normal(N_THETA + math.prod(SHAPE))
    with jax.enable_x64(True):
        theta, s = sharded_point(toy64, mesh, np.float64)
        vt, vs = jnp.asarray(v[:N_THETA]), jax.device_put(v[N_THETA:].reshape(SHAPE), field_sharding(mesh))
        for fn, obj, ad, ref in ((exact_hvp, toy64.U, "reverse", h @ v),
                                 (gauss_newton_hvp, toy64.residual, "forward", hgn @ v)):
            ht, hs = jax.jit(lambda *a, fn=fn, obj=obj, ad=ad: fn(obj, *a, ad=ad))(theta, s, vt, vs)
            out = np.concatenate([np.asarray(ht), np.asarray(hs).ravel()])
            assert rel(out, ref) < 1e-11, (fn.__name__, ad)
            assert hs.sharding.is_equivalent_to(field_sharding(mesh), 3)


# --------------------------------------------------------------------------- sharding in HLO

_COLLECTIVE = re.compile(r"=\s*(?P<shape>.*?)\s(?P<op>all-gather|all-reduce|all-to-all)(?:-start)?\(")
_SHAPE = re.compile(r"[a-z]+\d*\[([\d,]*)\]")


def collectives(hlo: str) -> list[tuple[str, int]]:
    """(op, largest element count among its result shapes) for each all-gather, all-reduce and
    all-to-all in HLO text."""
    out = []
    for line in hlo.splitlines():
        m = _COLLECTIVE.search(line)
        if m:
            sizes = [math.prod(int(d) for d in g.split(",") if d) for g in _SHAPE.findall(m["shape"])]
            out.append((m["op"], max(sizes, default=1)))
    return out


# The dtypes are those of the laplace calls above, whose compiled programs are reused (the
# partitioning does not depend on the dtype).
@pytest.mark.parametrize(("kind", "dtype"), [("exact", np.float32), ("gauss_newton", np.float64)])
def test_field_stays_sharded_in_compiled_hlo(toy64, counted_residual, mesh, kind, dtype):
    fns = (toy64.U, None) if kind == "exact" else (None, counted_residual[0])
    with jax.enable_x64(dtype == np.float64):
        theta, s = sharded_point(toy64, mesh, dtype)
        hlo = schur_columns.lower(*fns, theta, s, 1e-5, 100, kind=kind, ad="forward").compile().as_text()
    ops = collectives(hlo)
    # The CG inner products and the theta parts of the HVPs need all-reduces; every one must be
    # small: scalars, [n] vectors, and the [nz] line-of-sight profile that the theta_1 derivative
    # of the tilt reduces over x and y (16 values): nothing of the size of the field (1024
    # cells) or of a device's block (256 cells), and no all-gather or all-to-all at all.
    assert sum(op == "all-reduce" for op, _ in ops) >= 10
    assert all(op == "all-reduce" for op, _ in ops), ops
    assert max(size for _, size in ops) <= max(N_THETA, SHAPE[2]), ops
    # The neighbour exchange of the smoothing is a collective-permute (halo traffic only).
    assert "collective-permute" in hlo


# --------------------------------------------------------------------------- misc


def test_to_physical_delta_method():
    cov = np.array([[1.0, 0.3], [0.3, 0.5]])
    # Diagonal Jacobian (independent priors): cov_ij * d_i * d_j.
    d = np.array([2.0, 0.1])
    np.testing.assert_allclose(to_physical(cov, d), cov * np.outer(d, d), rtol=1e-15)
    # An affine transform theta_phys = mu + L z: the delta method is exact; compare with the
    # sample covariance of 200000 draws (Monte Carlo error ~ 3/sqrt(200000) ~ 0.7% -> 2%).
    jac = np.array([[1.0, 0.5], [-0.2, 2.0]])
    rng = np.random.default_rng(2)
    z = rng.multivariate_normal(np.zeros(2), cov, size=200_000)
    sample = np.cov((z @ jac.T).T)
    assert rel(to_physical(cov, jac), sample) < 2e-2
    with pytest.raises(ValueError, match="jac must be"):
        to_physical(cov, np.ones((3, 3)))


def test_errors_name_the_bad_value(toy64):
    theta, s = jnp.zeros(N_THETA), jnp.zeros(SHAPE)
    with pytest.raises(ValueError, match="needs residual"):
        laplace(toy64.U, theta, s, hessian="gauss_newton")
    with pytest.raises(ValueError, match="hessian must be one of"):
        laplace(toy64.U, theta, s, hessian="newton")
    with pytest.raises(ValueError, match=r"theta_z must be a vector \[n\]"):
        laplace(toy64.U, jnp.zeros((2, 2)), s)
