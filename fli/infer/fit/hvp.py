r"""Hessian-vector products of the posterior and conjugate gradients on the sharded field.

The pieces :mod:`fli.infer.fit.laplace` builds the marginal precision from (and the MAP study's
field solves use): with ``U(theta_z, s)`` the negative log posterior in standardised latents
and ``r`` its whitened residual, :func:`exact_hvp` gives ``H v`` for U's exact Hessian and
:func:`gauss_newton_hvp` ``(J^T J + I) v``; :func:`cg` solves ``A x = b`` for a pytree ``x``
(the field: inner products are ``jnp.sum`` over the sharded leaves, a local sum and one scalar
all-reduce). Nothing forms a Hessian or gathers the field.

Derivatives (``ad``): ``"forward"`` is forward-over-reverse, ``"reverse"`` reverse-over-reverse,
which also works through a ``jax.custom_vjp`` (JAX refuses forward mode there while lowering:
:func:`_is_custom_vjp_refusal` recognises it). :func:`hvp_cost_ratio` measures one HVP against
one gradient on a model (the :data:`HVP_COST` rule).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, PyTree

# Counting rule: one HVP costs HVP_COST evaluations of ``jax.value_and_grad(U)`` (the textbook
# figure for forward-over-reverse: a gradient plus its tangent). A rule, not a measurement:
# the ratio depends on the model's operations (docs/benchmarks.md, "Hessian-vector products",
# has what :func:`hvp_cost_ratio` measured). Measure on the real model and pass ``hvp_cost=``
# to :func:`laplace`.
HVP_COST = 2.0


# --------------------------------------------------------------------------- pytree algebra


def _dot(a: PyTree, b: PyTree) -> Array:
    """Real inner product of two pytrees: ``jnp.sum`` per leaf (a local sum and one scalar
    all-reduce for a sharded leaf), summed over leaves."""
    return sum(jnp.sum(x * y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def _axpy(alpha: Array, x: PyTree, y: PyTree) -> PyTree:
    """``alpha * x + y`` leaf by leaf."""
    return jax.tree.map(lambda xi, yi: (alpha * xi + yi).astype(yi.dtype), x, y)


# --------------------------------------------------------------------------- CG


class CGInfo(NamedTuple):
    """What :func:`cg` did (scalars; arrays under ``jit``/``vmap``).

    ``iterations``: CG iterations, one matvec each (int32; a given ``x0`` costs one more);
    ``relative_residual``: ``|b - A x| / |b|`` from CG's recursively updated residual (0 for
    ``b = 0``); ``converged``: it reached ``tol``
    without meeting negative curvature; ``negative_curvature``: a search direction with
    ``p^T A p <= 0`` (or NaN) was met, i.e. ``A`` is not positive definite; CG stopped there
    and ``x`` is the last iterate before that step.
    """

    iterations: Array
    relative_residual: Array
    converged: Array
    negative_curvature: Array


def _cg_step(x, r, p, rr, ap, dt):
    """One CG iteration given ``ap = A p``: ``(x, r, p, |r|^2, negative curvature)``; at
    negative curvature (``p^T A p <= 0``, or NaN) x stays and ``|r|^2`` is the old one."""
    pap = _dot(p, ap).astype(dt)
    neg = ~(pap > 0)  # also catches NaN
    alpha = jnp.where(neg, 0.0, rr / jnp.where(neg, 1.0, pap)).astype(dt)
    x = _axpy(alpha, p, x)
    r_new = _axpy(-alpha, ap, r)
    rr_new = _dot(r_new, r_new).astype(dt)
    beta = (rr_new / jnp.where(rr > 0, rr, 1.0)).astype(dt)
    p = _axpy(beta, p, r_new)
    return x, r_new, p, jnp.where(neg, rr, rr_new), neg


def cg(
    matvec: Callable[[PyTree], PyTree],
    b: PyTree,
    x0: PyTree | None = None,
    *,
    tol: float | Array = 1e-6,
    maxiter: int | Array = 1000,
) -> tuple[PyTree, CGInfo]:
    r"""Solve ``A x = b`` for a symmetric positive-definite linear operator on pytrees.

    ``matvec(x)`` returns ``A x`` with the structure, shapes, dtypes and sharding of ``b``
    (e.g. a field ``[nx, ny, nz]`` sharded ``P('x', 'y')``: every iterate keeps that
    sharding). Inner products are ``jnp.sum`` over leaves, so the only collectives CG adds
    are scalar all-reduces (two per iteration). Stops when the relative residual
    ``|r_k| / |b| <= tol``, after ``maxiter`` iterations, or at negative curvature
    ``p^T A p <= 0`` (see :class:`CGInfo`). ``x0=None`` starts from 0 and costs no matvec;
    a given ``x0`` costs one. Jittable (``lax.while_loop``; ``tol`` and ``maxiter`` may be
    traced), real dtypes only. Hestenes & Stiefel (1952), algorithm as in Nocedal & Wright,
    *Numerical Optimization*, Alg. 5.2.
    """
    leaves = jax.tree.leaves(b)
    if not leaves:
        raise ValueError("cg: b has no array leaves")
    if any(jnp.issubdtype(x.dtype, jnp.complexfloating) for x in leaves):
        raise ValueError("cg: complex leaves are not supported (real inner products only)")
    dt = jnp.result_type(*leaves)
    if x0 is None:
        x = jax.tree.map(jnp.zeros_like, b)
        r = b
    else:
        x = x0
        r = jax.tree.map(lambda bi, ai: bi - ai, b, matvec(x0))
    bb = _dot(b, b).astype(dt)
    rr = _dot(r, r).astype(dt)
    thresh = (jnp.asarray(tol, dt) ** 2) * bb
    maxiter = jnp.asarray(maxiter, jnp.int32)

    def cond(state):
        _, _, _, rr, k, neg = state
        return (rr > thresh) & (k < maxiter) & ~neg

    def body(state):
        x, r, p, rr, k, _ = state
        x, r, p, rr, neg = _cg_step(x, r, p, rr, matvec(p), dt)
        return x, r, p, rr, k + 1, neg

    state = (x, r, r, rr, jnp.int32(0), jnp.array(False))
    x, _, _, rr, k, neg = lax.while_loop(cond, body, state)
    rel = jnp.sqrt(rr / jnp.where(bb > 0, bb, 1.0))
    return x, CGInfo(k, rel, (rr <= thresh) & ~neg, neg)


# --------------------------------------------------------------------------- HVPs


def _is_custom_vjp_refusal(err: Exception) -> bool:
    return isinstance(err, TypeError) and "custom_vjp" in str(err)


def exact_hvp(
    U: Callable[..., Array],
    theta_z: Float[Array, " n"],
    s: PyTree,
    v_theta: Float[Array, " n"],
    v_s: PyTree,
    *,
    ad: Literal["forward", "reverse"] = "forward",
) -> tuple[Float[Array, " n"], PyTree]:
    """``H (v_theta, v_s)`` for the exact Hessian of ``U(theta_z, s)`` (a scalar).

    ``ad="forward"``: ``jax.jvp`` of ``jax.grad`` (forward-over-reverse). ``"reverse"``:
    ``jax.grad`` of ``<grad U, v>`` (reverse-over-reverse; works through ``custom_vjp``).
    The field part has the shape and sharding of ``s`` (``P('x', 'y')`` for a field); no
    Hessian is formed. Costs about :data:`HVP_COST` gradient evaluations.
    """
    z, v = (theta_z, s), (v_theta, v_s)
    grad_u = jax.grad(lambda zz: U(*zz))
    if ad == "forward":
        return jax.jvp(grad_u, (z,), (v,))[1]
    if ad == "reverse":
        return jax.grad(lambda zz: _dot(grad_u(zz), v))(z)
    raise ValueError(f"ad must be 'forward' or 'reverse' here, got {ad!r}")


def gauss_newton_hvp(
    residual: Callable[..., PyTree],
    theta_z: Float[Array, " n"],
    s: PyTree,
    v_theta: Float[Array, " n"],
    v_s: PyTree,
    *,
    ad: Literal["forward", "reverse"] = "forward",
) -> tuple[Float[Array, " n"], PyTree]:
    r"""``(J^T J + I) (v_theta, v_s)``, ``J = d residual / d(theta_z, s)`` (Gauss-Newton).

    The Gauss-Newton Hessian of ``U = |r|^2/2 + |z|^2/2`` in standard-normal latents:
    positive definite whatever the point. ``residual(theta_z, s)`` returns the whitened,
    masked residual (a pytree of maps, e.g. ``[n_bins, npix, npix]`` sharded
    ``P(None, 'x', 'y')``). ``ad="forward"``: ``J v`` by ``jax.jvp``, then ``J^T`` by
    ``jax.vjp``. ``"reverse"``: ``J^T`` by ``jax.vjp`` and ``J v`` as the transpose of that
    linear map (``jax.linear_transpose``), reverse mode only (works through ``custom_vjp``).
    """
    z, v = (theta_z, s), (v_theta, v_s)
    rfun = lambda zz: residual(*zz)
    if ad == "forward":
        # One primal pass: linearise, then the tangent map and its transpose.
        _, jvp_fun = jax.linearize(rfun, z)
        jv = jvp_fun(v)
        jtjv = jax.linear_transpose(jvp_fun, z)(jv)[0]
    elif ad == "reverse":
        r0, vjp_fun = jax.vjp(rfun, z)
        jv = jax.linear_transpose(lambda u: vjp_fun(u)[0], r0)(v)[0]
        jtjv = vjp_fun(jv)[0]
    else:
        raise ValueError(f"ad must be 'forward' or 'reverse' here, got {ad!r}")
    return jax.tree.map(lambda a, b: a + b, jtjv, v)


def _hvp_for(kind: str, U, residual, ad: str, args: tuple = ()):
    f = U if kind == "exact" else residual
    g = (lambda th, x: f(th, x, *args)) if args else f  # args: traced, never closed-over constants
    return partial(exact_hvp if kind == "exact" else gauss_newton_hvp, g, ad=ad)


# --------------------------------------------------------------------------- cost rule


def hvp_cost_ratio(
    U: Callable[..., Array],
    theta_z: Float[Array, " n"],
    s: PyTree,
    *,
    residual: Callable[..., PyTree] | None = None,
    kind: Literal["exact", "gauss_newton"] = "exact",
    ad: Literal["forward", "reverse"] = "forward",
    repeats: int = 5,
) -> dict[str, float]:
    """Measure one HVP against one ``jax.value_and_grad(U)`` (both jitted, compiled apart).

    Returns ``{"t_grad": s, "t_hvp": s, "ratio": t_hvp / t_grad}`` (median wall time of
    ``repeats`` runs after a warm-up). The check behind :data:`HVP_COST` on a given model.
    """
    vg = jax.jit(jax.value_and_grad(lambda t, f: U(t, f), argnums=(0, 1)))
    hv = jax.jit(_hvp_for(kind, U, residual, ad))

    def timed(fn, *args):
        jax.block_until_ready(fn(*args))
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    t_grad = timed(vg, theta_z, s)
    t_hvp = timed(hv, theta_z, s, theta_z, s)
    return {"t_grad": t_grad, "t_hvp": t_hvp, "ratio": t_hvp / t_grad}
