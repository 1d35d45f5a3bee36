r"""The low-rank posterior preconditioner's algebra and its Lanczos build: ``z = ref + C^{1/2} y``.

In the standardised flat latent ``z`` (:mod:`fli.infer.posterior.layout`: the white noise and theta,
all a priori unit normal) the Gauss-Newton Hessian of the negative log posterior is
``H = I + J^T J``, ``J = dr/dz``, ``r`` the whitened, masked residual of the ``m = bins x pixels``
map values. ``J^T J`` has rank at most ``m`` (plus the few theta directions) and every other
direction is exactly the unit prior, so a sampler with a unit or diagonal mass matrix is limited by
the stiffest data mode in its step size and by the prior's directions in its trajectory length
(DESIGN.md, "The geometry of the posterior").

:class:`LowRank` holds the top ``r`` eigenpairs ``(lam_i, v_i)`` of ``J^T J`` at ``ref`` (Lanczos,
:func:`lanczos`, from Gauss-Newton Hessian-vector products) and applies
``C = (I + V diag(lam) V^T)^-1`` and ``C^{1/2} = I + V diag((1 + lam)^{-1/2} - 1) V^T``, exact
matrix functions of one orthonormal eigenbasis (Woodbury without a solve). For the linear forward
at fixed theta the posterior of ``s`` is Gaussian with covariance ``H^-1``, so with ``r`` at the
rank of ``J`` the preconditioned posterior of ``y`` is exactly the unit normal
(tests/infer/sample/test_precondition.py). ``V`` is ``[r, size]``, sharded like the latent on its
last axis: ``V y`` is ``r`` local dot products and one all-reduce of ``r`` numbers, ``c @ V`` is
local, nothing gathers the field, and each device holds ``r * size / devices`` floats of ``V``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fli.infer.fit.hvp import _is_custom_vjp_refusal
from fli.infer.posterior.layout import FLAT_SPEC
from fli.infer.posterior.model import Data, Latents, Posterior

VECS_SPEC = P(None, *FLAT_SPEC)


class LowRank(NamedTuple):
    """``z = ref + C^{1/2} y`` with ``C = (I + V diag(lam) V^T)^{-1}``.

    Attributes:
        ref: ``[size]`` the flat latent it was built at (sharded like the latent).
        vecs: ``[r, size]`` orthonormal eigenvectors of ``J^T J`` (sharded ``P(None, AXES)``).
        lam: ``[r]`` their eigenvalues (>= 0, replicated).
    """

    ref: jax.Array
    vecs: jax.Array
    lam: jax.Array


def _coeffs(pre: LowRank, x):
    """``V x`` for one vector ``[size]`` or a batch ``[..., size]``: local dot products and
    one all-reduce of ``r`` numbers per vector."""
    return jnp.einsum("rn,...n->...r", pre.vecs, x)


def _expand(pre: LowRank, c):
    return jnp.einsum("...r,rn->...n", c, pre.vecs)


def sqrt_cov(pre: LowRank, y):
    """``C^{1/2} y`` (``y``: ``[size]`` or ``[..., size]``)."""
    d = jax.lax.rsqrt(1.0 + pre.lam) - 1.0
    return y + _expand(pre, d.astype(y.dtype) * _coeffs(pre, y))


def inv_sqrt_cov(pre: LowRank, x):
    """``C^{-1/2} x``, the inverse of :func:`sqrt_cov`."""
    d = jnp.sqrt(1.0 + pre.lam) - 1.0
    return x + _expand(pre, d.astype(x.dtype) * _coeffs(pre, x))


def to_z(pre: LowRank, y):
    """The flat latent of the preconditioned one: ``ref + C^{1/2} y``."""
    return pre.ref + sqrt_cov(pre, y)


def to_y(pre: LowRank, z):
    """The preconditioned latent of a flat one: ``C^{-1/2} (z - ref)``."""
    return inv_sqrt_cov(pre, z - pre.ref)


def residual_flat(post: Posterior):
    """``(z, data) -> `` the whitened residual of the flat latent ``z`` (the tail's dummies do
    not enter it, so ``J`` is zero along them)."""
    lay = post.layout

    def res(z, data: Data):
        theta, s = lay.unpack(z)
        return post.residual(Latents(theta, s), data)

    return res


def jtj_operator(post: Posterior) -> Callable:
    """``(zs [K, size], data, ad) -> (v -> mean_k J_k^T J_k v)``: the Gauss-Newton operator with
    the forward linearised once at the points ``zs`` (hvp.gauss_newton_hvp's two routes:
    ``ad="forward"``, or ``"reverse"`` only where the forward has a custom_vjp, which JAX's
    forward mode refuses). Traceable; each product is 2 gradient evaluations a point."""
    res = residual_flat(post)
    res_at = lambda zs, data: jax.vmap(lambda z: res(z, data))(zs)

    def operator(zs, data, ad):
        many = lambda v: jnp.broadcast_to(v, zs.shape)
        if ad == "forward":
            _, jvp = jax.linearize(lambda x: res_at(x, data), zs)
            jt = jax.linear_transpose(jvp, zs)
            return lambda v: jnp.mean(jt(jvp(many(v)))[0], axis=0)
        r0, vjp = jax.vjp(lambda x: res_at(x, data), zs)
        jv = jax.linear_transpose(lambda u: vjp(u)[0], r0)
        return lambda v: jnp.mean(vjp(jv(many(v))[0])[0], axis=0)

    return operator


def check_ad(ad: str) -> None:
    if ad not in ("auto", "forward", "reverse"):
        raise ValueError(f"ad must be 'auto', 'forward' or 'reverse', got {ad!r}")


def call_with_ad(programs: dict, ad: str, *args):
    """``(programs[ad](*args), the route taken)``: ``ad="auto"`` tries ``"forward"`` and falls
    back to ``"reverse"`` where JAX refuses forward mode through a custom_vjp (refused while
    tracing, before anything ran, so the arguments are intact)."""
    route = "forward" if ad == "auto" else ad
    try:
        return programs[route](*args), route
    except TypeError as e:
        if ad != "auto" or not _is_custom_vjp_refusal(e):
            raise
        return programs["reverse"](*args), "reverse"


# --------------------------------------------------------------------------- Lanczos


class LanczosState(NamedTuple):
    """``k`` steps of Lanczos on a symmetric operator: the basis ``q [k + 1, size]`` (sharded
    like ``vecs``), the tridiagonal's diagonal ``alpha [k]`` and off-diagonal ``beta [k]``,
    and the steps done ``j``."""

    q: jax.Array
    alpha: jax.Array
    beta: jax.Array
    j: jax.Array


def lanczos_start(v0, k: int) -> LanczosState:
    """The state before the first step, from a start vector ``v0 [size]`` (normalised here)."""
    q = jnp.zeros((k + 1, v0.shape[-1]), v0.dtype).at[0].set(v0 / jnp.linalg.norm(v0))
    z = jnp.zeros((k,), v0.dtype)
    return LanczosState(q, z, z, jnp.zeros((), jnp.int32))


def lanczos_steps(matvec: Callable, st: LanczosState, n) -> LanczosState:
    """``n`` (may be traced) more Lanczos steps (traceable; ``matvec`` is the operator, e.g. ``J^T J``), with
    full reorthogonalisation (twice classical Gram-Schmidt against every basis vector so far),
    so the basis stays orthonormal in float32 however many steps are taken.

    Breakdown (an invariant subspace found: the operator's rank is reached) sets the next
    basis vector to zero, and every later step then adds a zero row and zero coefficients."""
    k = st.alpha.shape[0]

    def body(_, st: LanczosState):
        j = st.j
        q = st.q[j]
        w = matvec(q)
        a = jnp.vdot(q, w)
        live = (jnp.arange(k + 1) <= j).astype(w.dtype)
        for _ in range(2):
            w = w - (live * (st.q @ w)) @ st.q
        b = jnp.linalg.norm(w)
        scale = jnp.maximum(jnp.abs(a), jnp.max(jnp.abs(st.alpha)))
        ok = (b > 1e-6 * scale) & (jnp.linalg.norm(q) > 0)
        nxt = jnp.where(ok, w / jnp.where(ok, b, 1.0), 0.0)
        return LanczosState(st.q.at[j + 1].set(nxt), st.alpha.at[j].set(a), st.beta.at[j].set(jnp.where(ok, b, 0.0)),
                            j + 1)

    return jax.lax.fori_loop(0, n, body, st)


def ritz(st: LanczosState):
    """The Ritz pairs of a finished Lanczos run, largest first: ``(vecs [k, size], lam [k])``
    (the eigenpairs of the tridiagonal mapped through the basis; host eigensolve of a k x k
    matrix, then one sharded matrix product). Negative round-off values are clipped to 0."""
    alpha = np.asarray(jax.device_get(st.alpha), np.float64)
    beta = np.asarray(jax.device_get(st.beta), np.float64)
    k = alpha.size
    t = np.diag(alpha) + np.diag(beta[:k - 1], 1) + np.diag(beta[:k - 1], -1)
    lam, s = np.linalg.eigh(t)
    order = np.argsort(lam)[::-1]
    lam, s = np.clip(lam[order], 0.0, None), s[:, order]
    sh = st.q.sharding
    vecs = jax.jit(lambda q, s: s.T @ q[:k], out_shardings=sh)(st.q, jnp.asarray(s, st.q.dtype))
    return vecs, lam


def build_lowrank(post: Posterior, data: Data, ref, rank: int, key, log: logging.Logger | None = None,
                  chunk: int = 16, ad: str = "auto", at=None, mask=None) -> tuple[LowRank, dict]:
    """:class:`LowRank` of ``rank`` Lanczos steps on the Gauss-Newton ``J^T J`` at the flat
    latent ``ref`` (from a fli-map run, never the truth), started from a random vector.

    ``at``: ``[K, size]`` points to take the curvature at instead, the operator then being
    their average ``(1/K) sum_k J_k^T J_k`` (the centre stays ``ref``); each step then costs
    ``K`` Hessian-vector products. None: at ``ref`` alone.

    The steps run ``chunk`` at a time in one compiled program that linearises the forward once
    per call (each step then costs one tangent and one transposed pass per point, counted as 2
    gradient evaluations, the laplace module's rule), with a progress line after each call.
    ``rank`` is capped at the rank the operator can have, K x (the map's values plus the
    sampled parameters).

    ``ad``: how ``J v`` is taken, ``"forward"`` (``jax.linearize``), ``"reverse"`` (the
    transpose of ``J^T``; works through a ``custom_vjp``, e.g. the PM forward's reversible
    adjoint) or ``"auto"``: forward where JAX allows it.

    ``mask``: ``[size]`` 0/1, the subspace to take the curvature in (``P J^T J P``, e.g. the
    field's entries alone for fits at fixed theta); the eigenvectors are then zero off it.

    Returns the preconditioner and a summary: rank, gradient evaluations, seconds, the
    eigenvalues (largest first)."""
    log = log or logging.getLogger("fli")
    lay = post.layout
    vsh = NamedSharding(lay.mesh, VECS_SPEC)
    at = jax.device_put(ref[None], vsh) if at is None else at
    n_at = int(at.shape[0])
    m = n_at * (post.n_terms + post.prior.n)
    k = int(min(rank, m))
    if k < rank:
        log.info("preconditioner: rank %d capped at %d, the rank J^T J can have (map values + parameters)", rank, k)
    res = residual_flat(post)
    operator = jtj_operator(post)

    @jax.jit
    def start(key, z, data, mask):
        # v0 = J^T u, u a random map: in the range of J^T J, so that the Krylov space holds no
        # direction of its null space (the prior's), whose Ritz value 0 would take a slot
        r0, vjp = jax.vjp(lambda x: res(x, data), z)
        v0 = vjp(jax.random.normal(key, r0.shape, r0.dtype) * (data.weight > 0))[0]
        v0 = v0 if mask is None else v0 * mask
        st = lanczos_start(jax.lax.with_sharding_constraint(v0, lay.sharding), k)
        return st._replace(q=jax.lax.with_sharding_constraint(st.q, vsh))

    def masked(op, mask):
        return op if mask is None else (lambda v: mask * op(v))

    # one program for every call: the number of steps is an argument
    programs = {ad: jax.jit(lambda z, data, st, n, mask, ad=ad: lanczos_steps(masked(operator(z, data, ad), mask),
                                                                              st, n),
                            donate_argnums=2) for ad in ("forward", "reverse")}
    check_ad(ad)
    t0 = time.perf_counter()
    st = start(key, at[0], data, mask)
    done = 0
    while done < k:
        n = min(chunk, k - done)
        st, ad = call_with_ad(programs, ad, at, data, st, jnp.int32(n), mask)
        done += n
        jax.block_until_ready(st.alpha)
        log.info("preconditioner: Lanczos step %d/%d (%.1f s)", done, k, time.perf_counter() - t0)
    vecs, lam = ritz(st)
    pre = LowRank(ref, vecs, jax.device_put(jnp.asarray(lam, ref.dtype), NamedSharding(lay.mesh, P())))
    seconds = time.perf_counter() - t0
    info = {"kind": "lowrank", "rank": k, "points": n_at, "grad_evals": 2 * k * n_at, "seconds": seconds, "ad": ad,
            "eigenvalues": lam.tolist()}
    log.info("preconditioner: rank %d at %d point(s) in %.1f s (%d gradient evaluations); J^T J eigenvalues %.3g "
             "(largest) to %.3g (smallest kept; directions with eigenvalues << 1 are the prior's already)", k, n_at,
             seconds, 2 * k * n_at, lam[0], lam[-1])
    return pre, info


# --------------------------------------------------------------------------- stored with a run


def save_lowrank(path, post: Posterior, pre: LowRank, info: dict, local: bool = False) -> None:
    """Write ``pre`` as (theta, field) pairs, a layout-independent form that any ``pdims``
    reads back (:func:`load_lowrank`), and mark it complete last. ``local``: ``pre`` lives on
    this process's own mesh (MUSE's ``spread=processes``), where every process holds the
    same one; process 0 writes it whole."""
    from fli.store.io import mark_complete, write_arrays  # noqa: PLC0415

    lay = post.layout
    theta, field = jax.jit(lay.unpack)(pre.ref)
    vt, vf = jax.jit(jax.vmap(lay.unpack))(pre.vecs)
    if local:  # numpy arrays: process 0 writes them, the others only meet it at the barriers
        field, vf = np.asarray(field), np.asarray(vf)
    write_arrays(path, {"ref_theta": np.asarray(theta), "ref_field": field, "vecs_theta": np.asarray(vt),
                        "vecs_field": vf, "lam": np.asarray(pre.lam)}, info)
    mark_complete(path, info)


def load_lowrank(path, post: Posterior) -> tuple[LowRank, dict]:
    """:class:`LowRank` saved by :func:`save_lowrank`, placed on this run's layout."""
    from pathlib import Path  # noqa: PLC0415

    import zarr  # noqa: PLC0415

    from fli.config import ConfigError  # noqa: PLC0415
    from fli.store.io import COMPLETE, read_array  # noqa: PLC0415

    if not (Path(path) / COMPLETE).is_file():
        raise ConfigError(f"{path} is not a complete preconditioner (the run stopped while writing it): remove it to "
                          f"build it again")
    lay, mesh = post.layout, post.fwd.grid.mesh
    root = zarr.open_group(str(path), mode="r")
    get = lambda name, leading=0: read_array(root[name], mesh, leading, where=f"{path}/{name}")
    ref = jax.jit(lay.pack)(jnp.asarray(get("ref_theta")), get("ref_field"))
    vecs = jax.jit(jax.vmap(lay.pack), out_shardings=NamedSharding(mesh, VECS_SPEC))(
        jnp.asarray(get("vecs_theta")), get("vecs_field", 1))
    lam = jax.device_put(jnp.asarray(get("lam"), ref.dtype), NamedSharding(mesh, P()))
    return LowRank(ref, vecs, lam), dict(root.attrs)
