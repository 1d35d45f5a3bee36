"""Cloud-in-cell (CIC) painting and reading for particles that never leave their device.

Layout (see ``fli.sharding``): the device mesh is ``('x', 'y')`` of shape ``(px, py)``; a field
``[nx, ny, nz]`` is sharded ``P('x', 'y')`` and each device holds a block ``[bx, by, nz]`` with
``bx = nx // px`` and ``by = ny // py``; axis 2 is local and periodic.

Particles: exactly one per grid cell. Particle ``(i, j, k)`` is stored as its displacement from
its Lagrangian cell, ``disp[i, j, k] = (dx, dy, dz)`` IN UNITS OF GRID CELLS, and sits at
``(i + dx, j + dy, k + dz)`` in the periodic box (cell centres at integer positions). ``disp``
``[nx, ny, nz, 3]`` is sharded like the fields, so a particle is always painted and read by the
device that owns its Lagrangian cell.

Halo. Each device paints into its block padded by ``halo`` cells on both sides in x and y
(z wraps locally), so a particle may move up to the halo width away from its block:

* the CIC footprint of a particle with transverse displacement ``d`` stays inside the padded
  block exactly when ``-halo <= d < halo``; :func:`check_halo` treats ``max |d| >= halo`` as an
  overflow (``halo >= floor(max |d|) + 1`` is enough);
* a particle beyond that is clipped onto the outermost padded cell: its mass is never lost
  (total mass is exact whatever the displacements), but it lands in the wrong cell, and it
  reads the field from that cell. The gradient with respect to the clipped component is 0.
  Nothing inside ``jit`` can raise, so callers carry :func:`max_displacement` out of the run
  and call :func:`check_halo` on the host afterwards.

Exchanges between neighbouring devices are in :mod:`fli.halo`.

Gradients. The local deposit and interpolation are ``jax.custom_jvp`` functions whose
tangents are written out so that reverse mode transposes them into one gather plus elementwise
terms (paint) and one gather plus one scatter per slab of particles (read): the form of the
hand-written VJPs they replaced, which XLA CPU runs several times faster than autodiff of the
scatter (whose transposes reduce over the 8 corners next to a gather); docs/benchmarks.md,
"Painting's derivatives", has the figures. The derivatives with respect to ``disp``,
``weight`` and the field(s) are exact (the derivative of the piecewise-multilinear CIC
weights, 0 across the clip; on a cell edge the one-sided value). Every mode works and composes:
``grad``/``vjp``, ``jvp``/``jacfwd``, and second derivatives such as Hessian-vector products
forward-over-reverse (``jvp`` of ``grad``) or reverse-over-reverse (``grad`` of ``<grad, v>``).
CIC is multilinear within a cell, so second derivatives with respect to the positions are
those of the multilinear pieces (the first derivative jumps at cell edges).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from fli.halo import (
    any_exchanged,
    check_blocks,
    fold_exchange,
    fold_local,
    jaxdecomp_ops,
    pad_local,
    wrap_pad_local,
)
from fli.sharding import FIELD_SPEC, mesh_pdims

__all__ = [
    "Stencil",
    "cic_stencil",
    "cic_paint",
    "cic_read",
    "max_displacement",
    "check_halo",
    "required_halo",
]

OVERFLOW_POLICIES = ("raise", "warn")

Array = jax.Array


def _check_disp(disp) -> tuple[int, int, int]:
    if disp.ndim != 4 or disp.shape[-1] != 3:
        raise ValueError(f"disp must have shape [nx, ny, nz, 3], got {tuple(disp.shape)}")
    if not jnp.issubdtype(disp.dtype, jnp.floating):
        raise ValueError(f"disp must be a floating-point array, got {disp.dtype}")
    return tuple(int(s) for s in disp.shape[:3])  # type: ignore[return-value]


# --------------------------------------------------------------------------- halo safety


def max_displacement(disp: Array) -> Array:
    """Largest ``|displacement|`` along x and y, in cells, over all particles (a traced scalar).

    Works inside ``jit`` on the sharded ``disp``; gradients are stopped. Carry it out of a run
    (e.g. the running maximum over PM steps) and pass it to :func:`check_halo` on the host.
    """
    return lax.stop_gradient(jnp.max(jnp.abs(disp[..., :2])))


def required_halo(max_disp: float) -> int:
    """Smallest halo (cells) whose padded block holds every CIC footprint: ``floor(max) + 1``."""
    return int(math.floor(float(max_disp))) + 1


def check_halo(max_disp, halo: int, policy: str = "raise") -> bool:
    """Host-side check of a measured :func:`max_displacement` against the halo width.

    Returns True when every CIC footprint fitted in the padded blocks (``max_disp < halo``).
    Otherwise, with ``policy="raise"`` raises ``ValueError``, with ``policy="warn"`` emits a
    ``RuntimeWarning`` and returns False. Overflowing particles were clipped onto the outermost
    halo cell: mass was conserved but misplaced, and the forces they read were wrong.
    A NaN displacement counts as an overflow.
    """
    if policy not in OVERFLOW_POLICIES:
        raise ValueError(f"on_overflow policy must be one of {OVERFLOW_POLICIES}, got {policy!r}")
    m = float(np.asarray(max_disp))
    if m < halo:  # False for NaN
        return True
    need = required_halo(m) if math.isfinite(m) else "(undefined: displacements are not finite)"
    msg = (
        f"particles moved {m:.4g} cells but halo is {halo} cells: increase simulation.halo to "
        f">= {need} (overflowing particles were clipped to the halo edge: mass conserved, "
        f"positions and forces wrong)"
    )
    if policy == "raise":
        raise ValueError(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=2)
    return False


# --------------------------------------------------------------------------- CIC stencil


_CORNERS = [(a, b, c) for a in (0, 1) for b in (0, 1) for c in (0, 1)]  # k = 4a + 2b + c


def _stencil(disp: Array, halo: int):
    """CIC stencil of the local particles ``disp`` ``[bx, by, nz, 3]`` (cells).

    Returns ``idx`` int32 ``[bx, by, nz, 8]``, flat indices of the 8 corners into the padded
    block ``[bx+2h, by+2h, nz]`` (C order, corner ``k = 4a + 2b + c``), and ``frac``
    ``[bx, by, nz, 3]``, the fractional positions (``w_k = wx[a] wy[b] wz[c]`` with
    ``w.[1] = frac``, ``w.[0] = 1 - frac``). ``frac`` is differentiable: its derivative with
    respect to ``disp`` is 1, except 0 along an x or y clipped onto the padded block.
    """
    bx, by, nz = disp.shape[:3]
    big_x, big_y = bx + 2 * halo, by + 2 * halo
    base = jnp.floor(disp)  # derivative 0: frac's derivative is disp's
    frac = disp - base  # in [0, 1)
    cell = base.astype(jnp.int32)
    shape = (bx, by, nz)
    i0 = lax.broadcasted_iota(jnp.int32, shape, 0) + halo + cell[..., 0]
    j0 = lax.broadcasted_iota(jnp.int32, shape, 1) + halo + cell[..., 1]
    k0 = lax.broadcasted_iota(jnp.int32, shape, 2) + cell[..., 2]
    fx, fy, fz = frac[..., 0], frac[..., 1], frac[..., 2]

    # Clip x and y onto the padded block: a particle beyond it puts all its mass on the
    # outermost cell (i0 < 0 -> cell 0; i0 > B-2 -> cell B-1). Exact for -h <= d < h.
    lo_x, hi_x = i0 < 0, i0 > big_x - 2
    lo_y, hi_y = j0 < 0, j0 > big_y - 2
    fx = jnp.where(lo_x, 0.0, jnp.where(hi_x, 1.0, fx))
    fy = jnp.where(lo_y, 0.0, jnp.where(hi_y, 1.0, fy))
    i0 = jnp.clip(i0, 0, big_x - 2)
    j0 = jnp.clip(j0, 0, big_y - 2)
    k0 = jnp.remainder(k0, nz)
    k1 = jnp.where(k0 + 1 == nz, 0, k0 + 1)

    ix = jnp.stack([i0, i0 + 1], -1)
    iy = jnp.stack([j0, j0 + 1], -1)
    iz = jnp.stack([k0, k1], -1)
    idx = (ix[..., :, None, None] * big_y + iy[..., None, :, None]) * nz + iz[..., None, None, :]
    return idx.reshape(shape + (8,)), jnp.stack([fx, fy, fz], -1)


class Stencil(NamedTuple):
    """CIC stencil of the local particles, computed once and shared (see :func:`cic_stencil`).

    Per particle ``[..., k]``: ``idx`` int32 ``[..., 8]`` flat indices of the 8 corners into the
    padded block (corner ``k = 4a + 2b + c``); ``frac`` ``[..., 3]`` the fractional positions
    (after clipping), from which the weights follow. ``frac`` carries the derivative with
    respect to the positions: the paint and the read are differentiated through it.
    """

    idx: Array
    frac: Array

    def rows(self, x0, n: int) -> Stencil:
        return Stencil(*(lax.dynamic_slice_in_dim(a, x0, n, 0) for a in self))


def _local_stencil(disp: Array, halo: int) -> Stencil:
    """The :class:`Stencil` of the local block, materialised once.

    Left to itself, XLA fuses the stencil arithmetic (floor, clip, remainder, selects, corner
    products) into every consumer (paint, read and both adjoints: four times per backward
    step), where it costs more than the scatters; the barrier stops that fusion and the
    adjoints take the stencil as a residual (docs/benchmarks.md, "Painting's derivatives").
    The corner weights are formed
    from ``frac`` in each kernel (a few products per particle, fused into its consumer): the
    kernels need them as differentiable functions of the positions.
    """
    return Stencil(*lax.optimization_barrier(_stencil(disp, halo)))


# The read's adjoint loops over slabs of whole x rows of about this many particles, so that its
# [N, 8, C] scatter updates and gathers never exist for the whole block at once.
CHUNK_PARTICLES = 1 << 14


def _rows_per_slab(bx: int, by: int, nz: int) -> int:
    """Largest divisor of ``bx`` whose slab ``[rows, by, nz]`` holds <= CHUNK_PARTICLES particles
    (at least one row)."""
    return max(r for r in range(1, bx + 1) if bx % r == 0 and (r == 1 or r * by * nz <= CHUNK_PARTICLES))


def _corner_weights(wx, wy, wz) -> Array:
    """``[..., 8]`` products ``wx[a] * wy[b] * wz[c]`` (broadcast form: fastest forward)."""
    px = jnp.stack(wx, -1)[..., :, None, None]
    py = jnp.stack(wy, -1)[..., None, :, None]
    pz = jnp.stack(wz, -1)[..., None, None, :]
    return (px * py * pz).reshape(px.shape[:-3] + (8,))


# --------------------------------------------------------------------------- local kernels
#
# The local deposit and interpolation are ``jax.custom_jvp`` functions of the stencil's
# fractional positions ``st.frac`` (which carry the derivative with respect to the
# positions) and of the masses / field. Their tangents are written out, linear in the input
# tangents, so that reverse mode transposes them into what hand-written VJPs would be: one
# gather plus elementwise terms (paint), one gather plus one scatter per slab of particles
# (read). Plain autodiff is correct too but, on XLA CPU, its transposes of the broadcast
# weight products (reductions over the 8 corners fused with gathers) ran up to 10-20x slower.
#
# Second derivatives (Hessian-vector products, forward-over-reverse or reverse-over-reverse)
# differentiate these rules again: they are ordinary JAX in the primal inputs. They also
# differentiate the primal implementations themselves, because JAX drops a custom JVP rule
# where it partially evaluates a loop body (``lax.scan``: the PM steps) and differentiates
# the primal there. So each primal here is correct under plain autodiff too (no
# stop_gradient on what it depends on); the rules only make first derivatives fast.
# CIC is multilinear within a cell: all derivatives are exact except on cell edges, where
# the first derivative jumps (one side's value is used).


def _pairs(frac: Array):
    """The 1D weights ``((1 - fx, fx), (1 - fy, fy), (1 - fz, fz))`` of ``frac`` ``[..., 3]``."""
    return tuple((1.0 - frac[..., i], frac[..., i]) for i in range(3))


def _weights(frac: Array) -> Array:
    """``[..., 8]`` CIC corner weights of the fractional positions ``frac`` ``[..., 3]``."""
    return _corner_weights(*_pairs(frac))


def _weight_tangents(pairs, t: Array) -> list:
    """Tangents of the 8 corner weights ``w_k = wx[a] wy[b] wz[c]`` (``k = 4a + 2b + c``) for
    the tangent ``t`` ``[..., 3]`` of the fractional position: a list of 8 arrays.

    One product per axis and pair of corners, e.g. ``q = wy[b] wz[c] tx`` added to
    ``w_(1,b,c)`` and subtracted from ``w_(0,b,c)``, so that the transpose reverse mode derives
    is ``sum_bc wy[b] wz[c] (g_(1,b,c) - g_(0,b,c))``: elementwise and unrolled.
    """
    (wx, wy, wz), (tx, ty, tz) = pairs, (t[..., 0], t[..., 1], t[..., 2])
    tw: list = [None] * 8

    def put(k, q, sign):
        if tw[k] is None:
            tw[k] = q if sign > 0 else -q
        else:
            tw[k] = tw[k] + q if sign > 0 else tw[k] - q

    for b in (0, 1):
        for c in (0, 1):
            q = wy[b] * wz[c] * tx
            put(4 + 2 * b + c, q, +1)
            put(2 * b + c, q, -1)
    for a in (0, 1):
        for c in (0, 1):
            q = wx[a] * wz[c] * ty
            put(4 * a + 2 + c, q, +1)
            put(4 * a + c, q, -1)
    for a in (0, 1):
        for b in (0, 1):
            q = wx[a] * wy[b] * tz
            put(4 * a + 2 * b + 1, q, +1)
            put(4 * a + 2 * b, q, -1)
    return tw


def _nonzero(t):
    return None if t is None or isinstance(t, SymbolicZero) else t


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _deposit(weight: Array | None, st: Stencil, size: int) -> Array:
    """CIC deposit of the local particles (stencil ``st``) into the flat padded block of
    ``size`` cells, ONE scatter-add."""
    w = _weights(st.frac)
    if weight is not None:
        w = w * weight.astype(w.dtype)[..., None]
    return jnp.zeros((size,), w.dtype).at[st.idx.reshape(-1)].add(w.reshape(-1), mode="promise_in_bounds")


def _deposit_tangent(weight, st, t_weight, t_frac, *, size):
    """Tangent of :func:`_deposit`, linear in ``t_weight`` and ``t_frac`` (None: zero): one
    scatter-add of the weights' tangents. Transposed: one gather of the cotangent at the
    corners and elementwise products."""
    dt = st.frac.dtype
    upd = None
    if t_frac is not None:
        tw = jnp.stack(_weight_tangents(_pairs(st.frac), t_frac), -1)
        upd = tw if weight is None else tw * weight.astype(dt)[..., None]
    if t_weight is not None:
        w, tm = _weights(st.frac), t_weight.astype(dt)
        uw = jnp.stack([w[..., k] * tm for k in range(8)], -1)  # transposes to an unrolled sum
        upd = uw if upd is None else upd + uw
    return jnp.zeros((size,), dt).at[st.idx.reshape(-1)].add(upd.reshape(-1), mode="promise_in_bounds")


@functools.partial(_deposit.defjvp, symbolic_zeros=True)
def _deposit_jvp(size, primals, tangents):
    weight, st = primals
    t_weight, t_frac = _nonzero(tangents[0]), _nonzero(tangents[1].frac)  # idx: no tangent
    out = _deposit(weight, st, size)
    if t_weight is None and t_frac is None:
        return out, jnp.zeros_like(out)
    # checkpointed: reverse mode keeps the inputs only (no [N, 8] products) and recomputes
    # the weights next to its gather
    tangent = jax.checkpoint(functools.partial(_deposit_tangent, size=size))
    return out, tangent(weight, st, t_weight, t_frac)


@jax.custom_jvp
def _interp(flat: Array, st: Stencil) -> Array:
    """CIC interpolation of the flat padded block ``[M, C]`` at the local particles (stencil
    ``st``): ONE gather of the 8 corners for all C components; returns ``[bx, by, nz, C]``."""
    dtype = jnp.result_type(flat.dtype, st.frac.dtype)
    w = _weights(st.frac).astype(dtype)
    vals = flat.at[st.idx].get(mode="promise_in_bounds").astype(dtype)  # [bx, by, nz, 8, C]
    out = vals[..., 0, :] * w[..., 0, None]
    for k in range(1, 8):  # unrolled: much faster on CPU than a sum over the corner axis
        out = out + vals[..., k, :] * w[..., k, None]
    return out


def _interp_tangent(flat, st, t_flat, t_frac):
    """Tangent of :func:`_interp` ``[bx, by, nz, C]``, linear in ``t_flat`` and ``t_frac``
    (None: zero), over slabs of whole x rows (:data:`CHUNK_PARTICLES`). Transposed, a slab is
    one scatter-add of ``w_k ct`` into the field's cotangent and one gather of the field for
    the positions' cotangent. Each slab is checkpointed: reverse mode keeps the inputs only
    and recomputes the slab's gathers and weights, so its ``[N, 8, C]`` temporaries never
    exist for the whole block. The slabs are the scanned axis of the stencil, ``t_frac`` and
    the output (not slices of a loop carry), so that the transposed loop touches each slab's
    cotangent only."""
    dtype = jnp.result_type(flat.dtype, st.frac.dtype)
    ncomp = flat.shape[-1]
    bx, by, nz = st.idx.shape[:3]
    rows = _rows_per_slab(bx, by, nz)

    @jax.checkpoint
    def slab(flat, t_flat, s, tf):
        acc = None
        if t_flat is not None:  # the field's tangent read at the particles
            w = _weights(s.frac).astype(dtype)
            tv = t_flat.at[s.idx].get(mode="promise_in_bounds").astype(dtype)  # [rows, by, nz, 8, C]
            acc = jnp.sum(tv * w[..., None], axis=-2)  # transposes to a broadcast
        if tf is not None:  # the weights' tangents times the field at the corners
            tw = _weight_tangents(_pairs(s.frac), tf)
            vals = flat.at[s.idx].get(mode="promise_in_bounds").astype(dtype)
            comps = []
            for q in range(ncomp):  # unrolled over corners and components: no reductions
                c = vals[..., 0, q] * tw[0].astype(dtype)
                for k in range(1, 8):
                    c = c + vals[..., k, q] * tw[k].astype(dtype)
                comps.append(c)
            a = jnp.stack(comps, -1)
            acc = a if acc is None else acc + a
        return acc

    if rows == bx:
        return slab(flat, t_flat, st, t_frac)
    n = bx // rows

    def split(x):  # [bx, ...] -> [n, rows, ...]: contiguous, free
        return None if x is None else x.reshape((n, rows) + x.shape[1:])

    xs = (Stencil(*(split(a) for a in st)), split(t_frac))
    _, out = lax.scan(lambda c, x: (c, slab(flat, t_flat, *x)), None, xs)
    return out.reshape((bx,) + out.shape[2:])


@functools.partial(_interp.defjvp, symbolic_zeros=True)
def _interp_jvp(primals, tangents):
    flat, st = primals
    t_flat, t_frac = _nonzero(tangents[0]), _nonzero(tangents[1].frac)  # idx: no tangent
    out = _interp(flat, st)
    if t_flat is None and t_frac is None:
        return out, jnp.zeros_like(out)
    return out, _interp_tangent(flat, st, t_flat, t_frac)


def _padded_size(disp: Array, halo: int) -> int:
    bx, by, nz = disp.shape[:3]
    return (bx + 2 * halo) * (by + 2 * halo) * nz


def _paint_padded(disp: Array, weight: Array | None, halo: int, st: Stencil | None = None) -> Array:
    """Local CIC deposit into the padded block ``[bx+2h, by+2h, nz]`` with ONE scatter-add."""
    bx, by, nz = disp.shape[:3]
    st = _local_stencil(disp, halo) if st is None else st
    return _deposit(weight, st, _padded_size(disp, halo)).reshape(bx + 2 * halo, by + 2 * halo, nz)


def _read_padded(padded: Array, disp: Array, halo: int, st: Stencil | None = None) -> Array:
    """Interpolate the padded local block ``[bx+2h, by+2h, nz, C]`` at the particles;
    returns ``[bx, by, nz, C]``."""
    st = _local_stencil(disp, halo) if st is None else st
    return _interp(padded.reshape(-1, padded.shape[-1]), st)


# --------------------------------------------------------------------------- paint / read


@functools.partial(jax.jit, static_argnames=("mesh", "halo", "exchange"))
def _paint(disp, weight, stencil, *, mesh, halo, exchange):
    pdims = mesh_pdims(mesh)
    args = (disp, weight, stencil)
    specs = (FIELD_SPEC, None if weight is None else FIELD_SPEC, None if stencil is None else FIELD_SPEC)

    def padded_local(d, w, st):
        return _paint_padded(d, w, halo, None if st is None else Stencil(*st))

    if exchange == "ppermute":

        def local(*a):
            return fold_local(padded_local(*a), halo, pdims)

        return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=FIELD_SPEC)(*args)
    padded = jax.shard_map(padded_local, mesh=mesh, in_specs=specs, out_specs=FIELD_SPEC)(*args)
    return fold_exchange(padded, mesh, halo, exchange)


def cic_stencil(disp: Array, mesh: Mesh, halo: int) -> Stencil:
    """The CIC :class:`Stencil` of the particles ``disp`` (cells), sharded ``P('x', 'y')``, to
    pass to :func:`cic_paint` and :func:`cic_read` at the same positions (as the PM force
    does): computed once instead of in each of them and again in each adjoint."""
    _check_disp(disp)
    check_blocks(disp.shape[:3], mesh, halo, "ppermute", "disp")
    return _stencil_global(disp, mesh=mesh, halo=int(halo))


@functools.partial(jax.jit, static_argnames=("mesh", "halo"))
def _stencil_global(disp, *, mesh, halo):
    return Stencil(*jax.shard_map(lambda d: tuple(_local_stencil(d, halo)), mesh=mesh, in_specs=FIELD_SPEC,
                                  out_specs=FIELD_SPEC)(disp))


def cic_paint(
    disp: Array,
    mesh: Mesh,
    halo: int,
    weight: Array | None = None,
    *,
    exchange: str = "ppermute",
    stencil: Stencil | None = None,
) -> Array:
    """CIC mass per cell ``[nx, ny, nz]`` (sharded ``P('x', 'y')``) of one particle per cell.

    Args:
        disp: displacements ``[nx, ny, nz, 3]`` in cells, sharded ``P('x', 'y')``; the result
            has its dtype.
        mesh: the ``('x', 'y')`` device mesh.
        halo: padding in cells, ``1 <= halo <= min(bx, by)``; must exceed every ``|dx|, |dy|``
            (see :func:`check_halo`); particles beyond it are clipped to the halo edge.
        weight: optional mass per particle ``[nx, ny, nz]`` (default 1: an unperturbed lattice
            paints 1 in every cell).
        exchange: ``"ppermute"`` (default) or ``"jaxdecomp"``.
        stencil: :func:`cic_stencil` of ``disp`` with the same mesh and halo, when the caller
            shares one between painting and reading (default: computed here).

    Differentiable with respect to ``disp`` and ``weight``. Shapes and the halo are checked
    here, before anything is traced.
    """
    grid = _check_disp(disp)
    check_blocks(grid, mesh, halo, exchange, "disp")
    if weight is not None and tuple(weight.shape) != grid:
        raise ValueError(f"weight must have shape {grid}, got {tuple(weight.shape)}")
    return _paint(disp, weight, None if stencil is None else tuple(stencil), mesh=mesh, halo=int(halo),
                  exchange=exchange)


@functools.partial(jax.jit, static_argnames=("mesh", "halo", "exchange", "layout"))
def _read(fields, disp, stencil, *, mesh, halo, exchange, layout):
    pdims = mesh_pdims(mesh)
    if layout == "single":
        fspec = FIELD_SPEC

        def to_last(f):
            return f[..., None]
    elif layout == "stacked":
        fspec = P(None, "x", "y")

        def to_last(f):
            return jnp.moveaxis(f, 0, -1)
    else:
        fspec = tuple(FIELD_SPEC for _ in fields)

        def to_last(f):
            return jnp.stack(f, axis=-1)

    sspec = None if stencil is None else FIELD_SPEC

    def stencil_of(st):
        return None if st is None else Stencil(*st)

    if exchange == "ppermute":

        def local(f, d, st):
            return _read_padded(pad_local(to_last(f), halo, pdims), d, halo, stencil_of(st))

        out = jax.shard_map(local, mesh=mesh, in_specs=(fspec, FIELD_SPEC, sspec), out_specs=FIELD_SPEC)(
            fields, disp, stencil
        )
        return out[..., 0] if layout == "single" else out

    ncomp = 1 if layout == "single" else len(fields) if layout == "tuple" else fields.shape[0]
    nz = disp.shape[2]

    def local_pad(f):
        g = wrap_pad_local(to_last(f), halo, pdims)
        return g.reshape(g.shape[0], g.shape[1], nz * ncomp)  # channels ride along z

    padded = jax.shard_map(local_pad, mesh=mesh, in_specs=(fspec,), out_specs=FIELD_SPEC)(fields)
    if any_exchanged(pdims):
        bx, by = disp.shape[0] // pdims[0], disp.shape[1] // pdims[1]
        padded = jaxdecomp_ops(mesh, halo, bx, by)[0](padded)

    def local_read(g, d, st):
        return _read_padded(g.reshape(g.shape[0], g.shape[1], nz, ncomp), d, halo, stencil_of(st))

    out = jax.shard_map(local_read, mesh=mesh, in_specs=(FIELD_SPEC, FIELD_SPEC, sspec), out_specs=FIELD_SPEC)(
        padded, disp, stencil
    )
    return out[..., 0] if layout == "single" else out


def cic_read(
    field: Array | Sequence[Array],
    disp: Array,
    mesh: Mesh,
    halo: int,
    *,
    exchange: str = "ppermute",
    stencil: Stencil | None = None,
) -> Array:
    """CIC (trilinear, periodic) interpolation of field(s) at the particles.

    ``field`` is one field ``[nx, ny, nz]`` -> returns ``[nx, ny, nz]``; or ``C`` components as
    ``[C, nx, ny, nz]`` or a tuple of ``C`` fields -> returns ``[nx, ny, nz, C]``, read in one
    pass (one exchange of the padded blocks, one gather of the 8 corners for all components).
    ``disp``, ``mesh``, ``halo``, ``exchange``, ``stencil``: as in :func:`cic_paint`, of which this is the
    transpose for fixed positions: ``<paint(d, w), f> == <w, read(f, d)>``. Differentiable
    with respect to the field(s) and ``disp``.
    """
    grid = _check_disp(disp)
    check_blocks(grid, mesh, halo, exchange, "disp")
    if isinstance(field, (tuple, list)):
        fields = tuple(field)
        if not fields:
            raise ValueError("cic_read needs at least one field")
        layout = "tuple"
        shapes = {tuple(f.shape) for f in fields}
        if shapes != {grid}:
            raise ValueError(f"every field must have shape {grid}, got {sorted(shapes)}")
    else:
        fields = field
        if field.ndim not in (3, 4):
            raise ValueError(f"field must be [nx, ny, nz] or [C, nx, ny, nz], got {tuple(field.shape)}")
        layout = "single" if field.ndim == 3 else "stacked"
        if tuple(field.shape[-3:]) != grid:
            raise ValueError(f"field grid {tuple(field.shape[-3:])} does not match disp grid {grid}")
    return _read(fields, disp, None if stencil is None else tuple(stencil), mesh=mesh, halo=int(halo),
                 exchange=exchange, layout=layout)
