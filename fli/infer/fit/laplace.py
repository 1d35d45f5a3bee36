r"""Laplace error of the cosmological parameters at the MAP, with the field marginalised.

In standardised latents, all a priori unit normal (``theta_z`` ``[n]`` replicated, n = 2..5, and the
white noise ``s``, a float32 ``[nx, ny, nz]`` array sharded ``P('x', 'y')`` or a pytree of such), the
negative log posterior is ``U = |r(theta_z, s)|^2 / 2 + |theta_z|^2 / 2 + |s|^2 / 2``, ``r`` the
whitened, masked residual (a pytree of sharded 2D maps). Its Hessian at the MAP, in blocks
``[[H_tt, H_ts], [H_st, H_ss]]``, gives the *conditional* precision of ``theta_z``, ``H_tt`` (field
held fixed), and the *marginal* one, the Schur complement ``S = H_tt - H_ts H_ss^-1 H_st``
(``S^-1 = [H^-1]_tt >= H_tt^-1``: the marginal covariance is the wider).

``S`` is built column by column from Hessian-vector products and a conjugate-gradient solve on
the field block (:mod:`fli.infer.fit.hvp`), whose inner products are a local sum and one scalar
all-reduce: the field Hessian is never formed and the field never gathered. The Hessian is the
exact one or the Gauss-Newton ``J^T J + I`` (``J = dr/d(theta_z, s)``, positive definite by
construction). ``ad``: ``"forward"`` (forward-over-reverse) or ``"reverse"``
(reverse-over-reverse); ``"auto"``, the default, takes the reverse one where JAX refuses forward
mode on a ``jax.custom_vjp`` (it does so while lowering). Both pass through fli.sim.nbody's
adjoints (tests/sim/test_second_order.py; docs/map.md, "Notes moved from the code's docstrings").

Entry points: :func:`laplace` (-> :class:`LaplaceResult`), :func:`schur_columns` and
:func:`to_physical` (delta method).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, PyTree

from fli.infer.fit.hvp import HVP_COST, CGInfo, _cg_step, _dot, _hvp_for, _is_custom_vjp_refusal
from fli.sim.sharding import process_allgather

HESSIANS = ("auto", "exact", "gauss_newton")
ADS = ("auto", "forward", "reverse")

# --------------------------------------------------------------------------- Schur columns


class SchurColumns(NamedTuple):
    """Raw output of :func:`schur_columns` (jax arrays; ``n`` parameters).

    ``h_tt`` ``[n, n]``: conditional precision (column j = theta part of ``H (e_j, 0)``);
    ``schur`` ``[n, n]``: column j = ``H_tt e_j - H_ts x_j`` with ``H_ss x_j = H_st e_j``
    (not symmetrised: its asymmetry measures the CG error); ``cg``: a :class:`CGInfo` of
    ``[n]`` arrays, one per column.
    """

    h_tt: Array
    schur: Array
    cg: CGInfo


@partial(jax.jit, static_argnames=("U", "residual", "kind", "ad"))
def schur_columns(
    U: Callable[..., Array] | None,
    residual: Callable[..., PyTree] | None,
    theta_z: Float[Array, " n"],
    s: PyTree,
    cg_tol: float | Array,
    cg_maxiter: int | Array,
    args: tuple = (),
    *,
    kind: Literal["exact", "gauss_newton"],
    ad: Literal["forward", "reverse"],
) -> SchurColumns:
    """The conditional precision and the Schur complement, one column per unit vector.

    One jitted program for all ``n`` columns (``lax.map``: sequential, one CG at a time, so
    memory is that of one column). Column j spends ``2 + cg.iterations[j]`` HVPs: one for
    ``H (e_j, 0)`` (giving ``H_tt e_j`` and ``b_j = H_st e_j``), one per CG iteration on
    ``H_ss x_j = b_j`` (the field part of ``H (0, p)``) and one for ``H (0, x_j)`` (its theta
    part is ``H_ts x_j``). The field ``s`` (sharded ``P('x', 'y')``) and every CG iterate
    keep its sharding; ``s`` is an argument, never a constant. ``U`` and ``residual`` are
    static (hashed by identity): the same callables reuse the compiled program; ``cg_tol``
    and ``cg_maxiter`` are traced.

    ``args``: what ``U`` and ``residual`` take after ``(theta_z, s)``, as arguments (see :func:`laplace`).
    (``H_ts x_j`` could also be read as ``[<b_i, x_j>]_i`` by symmetry, saving the last HVP
    of each column at the price of storing the ``n`` fields ``b_i``; measured on the test
    problem, the compile time is the same, and the saving is ``n`` of ``sum_j (2 + iters_j)``
    HVPs, about 2 %: not worth the memory.)
    """
    hvp = _hvp_for(kind, U, residual, ad, args)
    n = theta_z.shape[0]

    def column(e):
        return _schur_column(hvp, theta_z, s, e, cg_tol, cg_maxiter)

    h_cols, s_cols, info = lax.map(column, jnp.eye(n, dtype=theta_z.dtype))
    # lax.map stacks column j as row j: transpose to put it back as a column.
    return SchurColumns(h_cols.T, s_cols.T, info)


def _schur_column(hvp, theta_z, s, e, cg_tol, cg_maxiter):
    """``(H_tt e, H_tt e - H_ts x, CGInfo)`` with ``H_ss x = H_st e``, by one loop whose body
    holds the program's only HVP: phase 0 applies ``H`` to ``(e, 0)``, phase 1 runs CG on
    ``H_ss`` (:func:`fli.infer.fit.hvp.cg`'s iteration, the same stopping rules), phase 2 applies ``H`` to
    ``(0, x)``. Three call sites of the HVP compiled the second-order model three times;
    XLA's compile time, which dominates the Laplace step on CPU, fell with them (docs/
    benchmarks.md, "Compiling the Laplace step")."""
    dt = jnp.result_type(*jax.tree.leaves(s))
    zero_s = jax.tree.map(jnp.zeros_like, s)
    zero_t = jnp.zeros_like(theta_z)
    sel = lambda c, a, b: jax.tree.map(lambda u, v: jnp.where(c, u, v), a, b)
    tol2 = jnp.asarray(cg_tol, dt) ** 2
    maxiter = jnp.asarray(cg_maxiter, jnp.int32)
    zero = jnp.zeros((), dt)
    # (phase, x, r, p, rr, bb, k, neg, h_t, h_ts_x)
    state = (jnp.int32(0), zero_s, zero_s, zero_s, zero, zero, jnp.int32(0), jnp.array(False), zero_t, zero_t)

    def body(st):
        phase, x, r, p, rr, bb, k, neg, h_t, h_ts_x = st
        first, solving = phase == 0, phase == 1
        out_t, out_s = hvp(theta_z, s, jnp.where(first, e, zero_t), sel(solving, p, sel(first, zero_s, x)))
        # phase 0: b = H_st e starts CG at x = 0 (r = p = b)
        bb0 = _dot(out_s, out_s).astype(dt)
        # phase 1: one CG iteration, ap = H_ss p
        x1, r1, p1, rr1, neg1 = _cg_step(x, r, p, rr, out_s, dt)
        x = sel(first, zero_s, sel(solving, x1, x))
        r = sel(first, out_s, sel(solving, r1, r))
        p = sel(first, out_s, sel(solving, p1, p))
        rr = jnp.where(first, bb0, jnp.where(solving, rr1, rr))
        bb = jnp.where(first, bb0, bb)
        k = jnp.where(solving, k + 1, k)
        neg = jnp.where(solving, neg1, neg)
        h_t = jnp.where(first, out_t, h_t)
        h_ts_x = jnp.where(phase == 2, out_t, h_ts_x)
        more = (rr > tol2 * bb) & (k < maxiter) & ~neg  # cg's condition to iterate again
        phase = jnp.where(phase == 2, 3, jnp.where(more, 1, 2)).astype(jnp.int32)
        return phase, x, r, p, rr, bb, k, neg, h_t, h_ts_x

    _, _, _, _, rr, bb, k, neg, h_t, h_ts_x = lax.while_loop(lambda st: st[0] < 3, body, state)
    rel = jnp.sqrt(rr / jnp.where(bb > 0, bb, 1.0))
    return h_t, h_t - h_ts_x, CGInfo(k, rel, (rr <= tol2 * bb) & ~neg, neg)


# --------------------------------------------------------------------------- Laplace


@dataclasses.dataclass(frozen=True)
class LaplaceResult:
    """Gaussian (Laplace) approximation of ``theta_z`` at a point, in latent coordinates.

    Arrays are host numpy float64 (``n`` parameters), symmetrised (``(A + A^T) / 2``).

    * ``precision_marginal`` ``[n, n]``: the Schur complement ``H_tt - H_ts H_ss^{-1} H_st``
      (field marginalised); ``cov_marginal``, ``std_marginal`` ``[n]`` its inverse and the
      square roots of that inverse's diagonal (NaN where the diagonal is not positive);
    * ``precision_conditional``, ``cov_conditional``, ``std_conditional``: the same for
      ``H_tt`` (field fixed at the point);
    * ``hessian``: "exact" or "gauss_newton", the one these numbers come from;
      ``requested``: what was asked ("auto", "exact", "gauss_newton"); ``fallback_reason``:
      why "auto" left the exact Hessian (None if it did not); ``ad``: "forward" or "reverse";
    * ``positive_definite``: both precisions are (Cholesky succeeds) and CG met no negative
      curvature;
    * ``cg_iterations`` ``[n]`` int, ``cg_residual`` ``[n]`` (relative, CG's recursive
      residual), ``cg_converged`` ``[n]`` bool, ``cg_negative_curvature`` ``[n]`` bool: per
      column of the Hessian used;
    * ``schur_asymmetry``: ``max|S - S^T| / max|S|`` before symmetrising (an accuracy check
      on the CG solves: exact solves give 0);
    * ``n_hvp``: HVPs spent in all attempts (an "auto" fallback counts the exact attempt);
      ``cost_grad_evals``: ``hvp_cost * n_hvp``, the cost in gradient evaluations under the
      rule that one HVP costs ``hvp_cost`` (default :data:`HVP_COST` = 2) evaluations of
      ``jax.value_and_grad(U)``.
    """

    precision_marginal: np.ndarray
    cov_marginal: np.ndarray
    std_marginal: np.ndarray
    precision_conditional: np.ndarray
    cov_conditional: np.ndarray
    std_conditional: np.ndarray
    hessian: str
    requested: str
    fallback_reason: str | None
    ad: str
    positive_definite: bool
    cg_iterations: np.ndarray
    cg_residual: np.ndarray
    cg_converged: np.ndarray
    cg_negative_curvature: np.ndarray
    schur_asymmetry: float
    n_hvp: int
    cost_grad_evals: float


def _sym(a: np.ndarray) -> np.ndarray:
    return 0.5 * (a + a.T)


def _is_pd(a: np.ndarray) -> bool:
    if not np.all(np.isfinite(a)):
        return False
    try:
        np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        return False
    return True


def _inverse_and_std(prec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    try:
        cov = _sym(np.linalg.inv(prec))
    except np.linalg.LinAlgError:
        cov = np.full_like(prec, np.nan)
    d = np.diag(cov)
    std = np.where(d > 0, np.sqrt(np.where(d > 0, d, 1.0)), np.nan)
    return cov, std


def _min_eig(a: np.ndarray) -> float:
    return float(np.linalg.eigvalsh(a).min()) if np.all(np.isfinite(a)) else float("nan")


def _not_pd_reason(h_tt: np.ndarray, schur: np.ndarray, neg: np.ndarray) -> str | None:
    """Why the Hessian is not positive definite at this point, or None (host check)."""
    reasons = []
    if not _is_pd(h_tt):
        reasons.append(f"H_tt is not positive definite (min eigenvalue {_min_eig(h_tt):.3g})")
    if np.any(neg):
        cols = [int(j) for j in np.flatnonzero(neg)]
        reasons.append(f"CG on H_ss met negative curvature p^T H_ss p <= 0 (columns {cols})")
    elif not _is_pd(schur):
        reasons.append(f"the Schur complement is not positive definite (min eigenvalue {_min_eig(schur):.3g})")
    return "; ".join(reasons) or None


def laplace(
    U: Callable[..., Array],
    theta_z: Float[Array, " n"],
    s: PyTree,
    *,
    residual: Callable[..., PyTree] | None = None,
    cg_tol: float = 1e-6,
    cg_maxiter: int = 1000,
    hessian: Literal["auto", "exact", "gauss_newton"] = "auto",
    ad: Literal["auto", "forward", "reverse"] = "auto",
    hvp_cost: float = HVP_COST,
    args: tuple = (),
) -> LaplaceResult:
    r"""Marginal and conditional Laplace precision of ``theta_z`` at ``(theta_z, s)``.

    ``U(theta_z, s)`` is the negative log posterior in standard-normal latents (scalar),
    ``theta_z`` ``[n]`` replicated, ``s`` the field ``[nx, ny, nz]`` sharded ``P('x', 'y')``
    (or a pytree of fields), usually the MAP. ``residual(theta_z, s)`` is the whitened
    residual ``r`` with ``U = |r|^2/2 + |theta_z|^2/2 + |s|^2/2`` (up to a constant); it is
    needed for ``hessian="gauss_newton"`` and for the fallback of ``"auto"``. ``args``: both are
    called ``U(theta_z, s, *args)``; pass the observation so (JAX refuses closures over arrays that span processes).

    ``hessian="auto"`` uses the exact Hessian and falls back to Gauss-Newton
    ``J^T J + I`` when the exact one is shown not positive definite at this point: ``H_tt``
    or the Schur complement fails a Cholesky factorisation, or CG on ``H_ss`` meets
    ``p^T H_ss p <= 0``. (CG sees only a Krylov subspace: an indefinite ``H_ss`` can go
    unnoticed if neither shows it.) Without ``residual`` it returns the exact result with
    ``positive_definite=False`` and a warning.

    CG per column stops at relative residual ``cg_tol`` or ``cg_maxiter`` iterations; the
    Schur error is about ``cg_tol`` times the condition number of ``H_ss`` relative to
    ``H_ts H_ss^{-1} H_st``. The device work is one jitted program per Hessian
    (:func:`schur_columns`, compiled once for all columns); the ``n x n`` algebra is on the
    host in float64. The field is never gathered and no field Hessian is formed.
    Counting rule: one HVP = ``hvp_cost`` gradient evaluations (default :data:`HVP_COST` = 2;
    measure a model's own with :func:`fli.infer.fit.hvp.hvp_cost_ratio`); ``n`` columns cost
    ``sum_j (2 + cg_iterations_j)`` HVPs.
    Not jittable itself (host decisions); returns a :class:`LaplaceResult`.
    """
    if hessian not in HESSIANS:
        raise ValueError(f"hessian must be one of {HESSIANS}, got {hessian!r}")
    if ad not in ADS:
        raise ValueError(f"ad must be one of {ADS}, got {ad!r}")
    if hessian == "gauss_newton" and residual is None:
        raise ValueError("hessian='gauss_newton' needs residual(theta_z, s), got residual=None")
    theta_z = jnp.asarray(theta_z)
    if theta_z.ndim != 1 or theta_z.shape[0] < 1:
        raise ValueError(f"theta_z must be a vector [n] with n >= 1, got shape {theta_z.shape}")
    if cg_tol <= 0 or cg_maxiter < 1:
        raise ValueError(f"cg_tol must be > 0 and cg_maxiter >= 1, got {cg_tol} and {cg_maxiter}")
    if not hvp_cost > 0:
        raise ValueError(f"hvp_cost must be > 0 gradient evaluations, got {hvp_cost}")

    def attempt(kind: str, ad: str):
        # Pass only the callable this Hessian uses, so that the other does not key the jit cache.
        fns = (U, None) if kind == "exact" else (None, residual)
        run = lambda a: schur_columns(*fns, theta_z, s, cg_tol, cg_maxiter, tuple(args), kind=kind, ad=a)
        ad_used = "forward" if ad == "auto" else ad
        try:
            out = run(ad_used)
        except TypeError as err:
            # JAX refuses forward mode over some custom_vjp rules while lowering (not while
            # tracing: jax.eval_shape passes), so the cheapest test is the forward attempt itself.
            if ad != "auto" or not _is_custom_vjp_refusal(err):
                raise
            ad_used = "reverse"
            out = run(ad_used)
        h_tt, schur = (np.asarray(process_allgather(a), np.float64) for a in (out.h_tt, out.schur))
        info = CGInfo(*(np.asarray(process_allgather(a)) for a in out.cg))
        return ad_used, h_tt, schur, info

    used = "gauss_newton" if hessian == "gauss_newton" else "exact"
    ad_used, h_tt, schur, info = attempt(used, ad)
    n_hvp = int(np.sum(2 + info.iterations.astype(np.int64)))
    reason = _not_pd_reason(_sym(h_tt), _sym(schur), info.negative_curvature)
    fallback = None
    if hessian == "auto" and reason is not None and residual is None:
        warnings.warn(f"laplace: the exact Hessian is not positive definite ({reason}) and no residual "
                      "was given for the Gauss-Newton fallback: returning the exact result", stacklevel=2)
    elif hessian == "auto" and reason is not None:
        fallback = f"exact Hessian not positive definite: {reason}"
        # The residual is part of U: if forward mode was refused for U it will be for r too.
        used = "gauss_newton"
        ad_used, h_tt, schur, info = attempt(used, "reverse" if ad_used == "reverse" else ad)
        n_hvp += int(np.sum(2 + info.iterations.astype(np.int64)))
        reason = _not_pd_reason(_sym(h_tt), _sym(schur), info.negative_curvature)
        if reason is not None:  # round-off or a stalled CG: J^T J + I is PD in exact arithmetic
            warnings.warn(f"laplace: the Gauss-Newton fallback is not positive definite ({reason})", stacklevel=2)
    elif reason is not None:
        warnings.warn(f"laplace: the {used} Hessian is not positive definite ({reason})", stacklevel=2)
    stalled = ~info.converged & ~info.negative_curvature  # negative curvature is reported above
    if np.any(stalled):
        cols = [int(j) for j in np.flatnonzero(stalled)]
        warnings.warn(f"laplace: CG did not reach cg_tol={cg_tol:g} within cg_maxiter={cg_maxiter} in columns "
                      f"{cols} (relative residuals {info.relative_residual[cols].tolist()})", stacklevel=2)

    scale = np.max(np.abs(schur))
    asym = float(np.max(np.abs(schur - schur.T)) / scale) if scale > 0 else 0.0
    prec_m, prec_c = _sym(schur), _sym(h_tt)
    cov_m, std_m = _inverse_and_std(prec_m)
    cov_c, std_c = _inverse_and_std(prec_c)
    return LaplaceResult(
        precision_marginal=prec_m, cov_marginal=cov_m, std_marginal=std_m,
        precision_conditional=prec_c, cov_conditional=cov_c, std_conditional=std_c,
        hessian=used, requested=hessian, fallback_reason=fallback, ad=ad_used,
        positive_definite=reason is None,
        cg_iterations=info.iterations.astype(np.int64),
        cg_residual=np.asarray(info.relative_residual, np.float64),
        cg_converged=np.asarray(info.converged, bool),
        cg_negative_curvature=np.asarray(info.negative_curvature, bool),
        schur_asymmetry=asym, n_hvp=n_hvp, cost_grad_evals=float(hvp_cost) * n_hvp,
    )


def to_physical(cov_z: Float[Any, "n n"], jac: Float[Any, "n n"] | Float[Any, " n"]) -> np.ndarray:
    r"""Delta method: the covariance of the physical parameters from the latent one.

    ``cov_phys = J cov_z J^T`` with ``J = d theta_phys / d theta_z`` ``[n, n]`` the Jacobian
    of the prior transform at the point (e.g. ``jax.jacfwd(transform)(theta_z_map)``); a
    vector ``[n]`` is taken as a diagonal Jacobian (independent priors). First order in the
    latent width: exact for affine transforms. Units: those of ``theta_phys`` squared.
    """
    cov_z = np.asarray(cov_z, np.float64)
    jac = np.asarray(jac, np.float64)
    n = cov_z.shape[0]
    if cov_z.shape != (n, n):
        raise ValueError(f"cov_z must be square [n, n], got shape {cov_z.shape}")
    if jac.shape == (n,):
        jac = np.diag(jac)
    if jac.shape != (n, n):
        raise ValueError(f"jac must be [{n}, {n}] or a diagonal [{n}] for cov_z [{n}, {n}], got shape {jac.shape}")
    return _sym(jac @ cov_z @ jac.T)
