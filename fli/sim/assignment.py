"""Mass assignment on one device's block: the CIC and TSC stencils, weights and their derivatives.

:mod:`fli.sim.painting` shards these kernels and exchanges the halos; here is one padded block
``[bx+2h, by+2h, nz]`` (C order, flattened) and the particles ``disp`` ``[bx, by, nz, 3]`` (cells)
of its own Lagrangian cells. Two schemes (``SCHEMES``), each a product of 1D kernels:

* ``"cic"``: 2 points per axis, weights ``(1 - f, f)`` of ``f`` in ``[0, 1)`` past the lower point.
  Continuous, but its first derivative jumps where a particle crosses a grid point, so a potential
  built on it is only piecewise smooth (docs/muse_studies.md, "Why the PM fits stall").
* ``"tsc"``: 3 points per axis around the nearest, weights ``((1/2 - f)^2 / 2, 3/4 - f^2,
  (1/2 + f)^2 / 2)`` of ``f`` in ``[-1/2, 1/2)``: a quadratic spline, continuous first derivatives.

The scheme travels with the :class:`Stencil` (its number of corners). The deposit and the
interpolation are ``jax.custom_jvp`` functions whose tangents reverse mode transposes into gathers
and scatters, several times faster on XLA CPU than autodiff of the scatter (docs/benchmarks.md,
"Painting's derivatives"). Derivatives in positions, masses and fields are exact (0 along a
clipped axis; CIC's one-sided on a grid point), and second derivatives differentiate the rules
again. JAX drops a custom JVP rule where it partially evaluates a loop body (the PM's
``lax.scan``) and differentiates the primal there, so each primal is correct under plain autodiff
too (no stop_gradient on what it depends on); the rules only make first derivatives fast.
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

Array = jax.Array

SCHEMES = ("cic", "tsc")
POINTS = {"cic": 2, "tsc": 3}  # grid points per axis in a particle's footprint

# A stencil's arrays are [x, corner or coordinate, y, z] over the particles, so that their minor
# axes, the ones XLA CPU vectorises, are the particles' y and z. With the 27 corners (or the 3
# coordinates) last, the gradient took 1.5x as long on tiny TSC and 1.1x at the default size, on
# one core (docs/benchmarks.md, "The stencil's layout"). Sharded P('x', None, 'y') like the
# particles they belong to.
LAYOUT = "x, corner, y, z"


def check_scheme(scheme: str) -> int:
    """Points per axis of ``scheme``; ``ValueError`` naming the valid ones otherwise."""
    if scheme not in POINTS:
        raise ValueError(f"mass assignment scheme must be one of {SCHEMES}, got {scheme!r}")
    return POINTS[scheme]


def scheme_of(corners: int) -> str:
    """The scheme whose stencil has ``corners`` corners (8: cic, 27: tsc)."""
    for name, n in POINTS.items():
        if n**3 == corners:
            return name
    raise ValueError(f"a stencil has 8 (cic) or 27 (tsc) corners, got {corners}")


# --------------------------------------------------------------------------- stencil


def _stencil(disp: Array, halo: int, scheme: str = "cic"):
    """Stencil of the local particles ``disp`` ``[bx, by, nz, 3]`` (cells).

    Returns ``idx`` int32 ``[bx, n^3, by, nz]`` (``n`` points per axis), flat indices of the
    corners into the padded block ``[bx+2h, by+2h, nz]`` (C order, corner
    ``k = (a n + b) n + c`` for the points ``a, b, c`` along x, y, z), and ``frac``
    ``[bx, 3, by, nz]``, the fractional positions from which the weights follow (CIC: past the
    lower point, in ``[0, 1)``; TSC: from the nearest point, in ``[-1/2, 1/2)``). ``frac`` is
    differentiable: its derivative with respect to ``disp`` is 1, except 0 along an x or y
    clipped onto the padded block.

    The layout (:data:`LAYOUT`): the corners and the coordinates sit between x and y, so that
    every array the kernels compute on ends in the particles' ``[by, nz]`` (what XLA
    vectorises) and a slab of whole x rows is a contiguous leading slice.
    """
    n = check_scheme(scheme)
    bx, by, nz = disp.shape[:3]
    big_x, big_y = bx + 2 * halo, by + 2 * halo
    d = jnp.moveaxis(disp, -1, 1)  # [bx, 3, by, nz]
    # derivative 0: frac's derivative is disp's
    base = jnp.floor(d) if scheme == "cic" else jnp.floor(d + 0.5)
    frac = d - base
    cell = base.astype(jnp.int32) - (n - 2)  # the lowest point of the footprint
    shape = (bx, by, nz)
    i0 = lax.broadcasted_iota(jnp.int32, shape, 0) + halo + cell[:, 0]
    j0 = lax.broadcasted_iota(jnp.int32, shape, 1) + halo + cell[:, 1]
    k0 = lax.broadcasted_iota(jnp.int32, shape, 2) + cell[:, 2]
    fx, fy, fz = frac[:, 0], frac[:, 1], frac[:, 2]

    # Clip x and y onto the padded block: a particle beyond it puts its mass on the outermost
    # cell (CIC) or the two outermost cells (TSC, f = -+1/2). Exact for particles inside the
    # halo (painting.check_halo).
    lo_x, hi_x = i0 < 0, i0 > big_x - n
    lo_y, hi_y = j0 < 0, j0 > big_y - n
    lo_f, hi_f = (0.0, 1.0) if scheme == "cic" else (-0.5, 0.5)
    fx = jnp.where(lo_x, lo_f, jnp.where(hi_x, hi_f, fx))
    fy = jnp.where(lo_y, lo_f, jnp.where(hi_y, hi_f, fy))
    i0 = jnp.clip(i0, 0, big_x - n)
    j0 = jnp.clip(j0, 0, big_y - n)
    k0 = jnp.remainder(k0, nz)

    rows = [(i0 + a) * big_y for a in range(n)]
    cols = [j0 + b for b in range(n)]
    deps = [jnp.remainder(k0 + c, nz) for c in range(n)]
    idx = [(rows[a] + cols[b]) * nz + deps[c] for a, b, c in itertools.product(range(n), repeat=3)]
    return jnp.stack(idx, 1), jnp.stack([fx, fy, fz], 1)


class Stencil(NamedTuple):
    """Stencil of the local particles, computed once and shared (see :func:`fli.sim.painting.make_stencil`).

    In the layout :data:`LAYOUT` (the particles' x, then the corners or coordinates, then their
    y and z): ``idx`` int32 ``[bx, n^3, by, nz]`` flat indices of the corners into the padded
    block; ``frac`` ``[bx, 3, by, nz]`` the fractional positions (after clipping), from which
    the weights follow. ``frac`` carries the derivative with respect to the positions: the paint
    and the read are differentiated through it. The number of corners names the scheme.
    """

    idx: Array
    frac: Array

    @property
    def scheme(self) -> str:
        return scheme_of(self.idx.shape[1])


def local_stencil(disp: Array, halo: int, scheme: str = "cic") -> Stencil:
    """The :class:`Stencil` of the local block, materialised once.

    Left to itself, XLA fuses the stencil arithmetic (floor, clip, remainder, selects, corner
    products) into every consumer (paint, read and both adjoints: four times per backward
    step), where it costs more than the scatters; the barrier stopped that fusion and the
    adjoints took the stencil as a residual (docs/benchmarks.md, "Painting's derivatives"). The
    XLA CPU of jax 0.10 drops the barrier and recomputes the corner indices in each gather and
    scatter from three per-axis arrays ("The stencil's layout" there); it is kept for the
    backends that honour it.
    The corner weights are formed from ``frac`` in each kernel (a few products per particle,
    fused into its consumer): the kernels need them as differentiable functions of the
    positions.
    """
    return Stencil(*lax.optimization_barrier(_stencil(disp, halo, scheme)))


# The read's adjoint loops over slabs of whole x rows of about this many particles, so that its
# [N, n^3, C] scatter updates and gathers never exist for the whole block at once.
CHUNK_PARTICLES = 1 << 14


def _rows_per_slab(bx: int, by: int, nz: int) -> int:
    """Largest divisor of ``bx`` whose slab ``[rows, by, nz]`` holds <= CHUNK_PARTICLES particles
    (at least one row)."""
    return max(r for r in range(1, bx + 1) if bx % r == 0 and (r == 1 or r * by * nz <= CHUNK_PARTICLES))


# --------------------------------------------------------------------------- weights
#
# The local deposit and interpolation are ``jax.custom_jvp`` functions of the stencil's
# fractional positions ``st.frac`` (which carry the derivative with respect to the
# positions) and of the masses / field. Their tangents are written out, linear in the input
# tangents, so that reverse mode transposes them into what hand-written VJPs would be: one
# gather plus elementwise terms (paint), one gather plus one scatter per slab of particles
# (read). Plain autodiff is correct too but, on XLA CPU, its transposes of the broadcast
# weight products (reductions over the corners fused with gathers) ran up to 10-20x slower.


def _corner_weights(wx, wy, wz) -> Array:
    """``[bx, n^3, by, nz]`` products ``wx[a] * wy[b] * wz[c]`` of the 1D weights (each a tuple of
    ``n`` arrays ``[bx, by, nz]``), corner ``k = (a n + b) n + c``."""
    return jnp.stack([wx[a] * wy[b] * wz[c] for a, b, c in itertools.product(range(len(wx)), repeat=3)], 1)


def tsc_weights(f):
    """TSC's 1D weights at the points -1, 0, +1 around the nearest one, for the offset ``f`` in
    ``[-1/2, 1/2)`` from it: ``((1/2 - f)^2 / 2, 3/4 - f^2, (1/2 + f)^2 / 2)``."""
    return 0.5 * (0.5 - f) ** 2, 0.75 - f * f, 0.5 * (0.5 + f) ** 2


def _axis_weights(frac: Array, n: int):
    """The 1D weights of ``frac`` ``[bx, 3, by, nz]`` per axis: CIC ``(1 - f, f)``; TSC :func:`tsc_weights`."""
    f = [frac[:, i] for i in range(3)]
    if n == 2:
        return tuple((1.0 - g, g) for g in f)
    return tuple(tsc_weights(g) for g in f)


def _tsc_slopes(frac: Array):
    """The TSC weights' derivatives per axis: ``(f - 1/2, -2 f, f + 1/2)`` (CIC's are -1, 1)."""
    f = [frac[:, i] for i in range(3)]
    return tuple((g - 0.5, -2.0 * g, g + 0.5) for g in f)


def _weights(frac: Array, n: int) -> Array:
    """``[bx, n^3, by, nz]`` corner weights of the fractional positions ``frac`` ``[bx, 3, by, nz]``."""
    return _corner_weights(*_axis_weights(frac, n))


def _cic_weight_tangents(pairs, t: Array) -> list:
    """Tangents of the 8 CIC corner weights ``w_k = wx[a] wy[b] wz[c]`` (``k = 4a + 2b + c``) for
    the tangent ``t`` ``[bx, 3, by, nz]`` of the fractional position: a list of 8 arrays ``[bx, by, nz]``.

    One product per axis and pair of corners, e.g. ``q = wy[b] wz[c] tx`` added to
    ``w_(1,b,c)`` and subtracted from ``w_(0,b,c)``, so that the transpose reverse mode derives
    is ``sum_bc wy[b] wz[c] (g_(1,b,c) - g_(0,b,c))``: elementwise and unrolled.
    """
    (wx, wy, wz), (tx, ty, tz) = pairs, (t[:, 0], t[:, 1], t[:, 2])
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


def _weight_tangents(frac: Array, t: Array, n: int) -> list:
    """Tangents of the ``n^3`` corner weights for the tangent ``t`` ``[bx, 3, by, nz]`` of ``frac``:
    a list of ``n^3`` arrays ``[bx, by, nz]``, unrolled (elementwise under transposition). TSC's corner
    ``(a, b, c)`` moves by ``w'x[a] wy[b] wz[c] tx + wx[a] w'y[b] wz[c] ty + wx[a] wy[b] w'z[c] tz``."""
    w = _axis_weights(frac, n)
    if n == 2:
        return _cic_weight_tangents(w, t)
    (wx, wy, wz), (sx, sy, sz) = w, _tsc_slopes(frac)
    tx, ty, tz = t[:, 0], t[:, 1], t[:, 2]
    dx = [s * tx for s in sx]
    dy = [s * ty for s in sy]
    dz = [s * tz for s in sz]
    return [dx[a] * wy[b] * wz[c] + wx[a] * (dy[b] * wz[c] + wy[b] * dz[c])
            for a, b, c in itertools.product(range(n), repeat=3)]


def _nonzero(t):
    return None if t is None or isinstance(t, SymbolicZero) else t


def _points(st: Stencil) -> int:
    return POINTS[st.scheme]


# --------------------------------------------------------------------------- deposit


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _deposit(weight: Array | None, st: Stencil, size: int) -> Array:
    """Deposit of the local particles (stencil ``st``) into the flat padded block of ``size``
    cells, ONE scatter-add."""
    w = _weights(st.frac, _points(st))
    if weight is not None:
        w = w * weight.astype(w.dtype)[:, None]
    return jnp.zeros((size,), w.dtype).at[st.idx.reshape(-1)].add(w.reshape(-1), mode="promise_in_bounds")


def _deposit_tangent(weight, st, t_weight, t_frac, *, size):
    """Tangent of :func:`_deposit`, linear in ``t_weight`` and ``t_frac`` (None: zero): one
    scatter-add of the weights' tangents. Transposed: one gather of the cotangent at the
    corners and elementwise products."""
    dt, n = st.frac.dtype, _points(st)
    upd = None
    if t_frac is not None:
        tw = jnp.stack(_weight_tangents(st.frac, t_frac, n), 1)
        upd = tw if weight is None else tw * weight.astype(dt)[:, None]
    if t_weight is not None:
        w, tm = _weights(st.frac, n), t_weight.astype(dt)
        uw = jnp.stack([w[:, k] * tm for k in range(n**3)], 1)  # transposes to an unrolled sum
        upd = uw if upd is None else upd + uw
    return jnp.zeros((size,), dt).at[st.idx.reshape(-1)].add(upd.reshape(-1), mode="promise_in_bounds")


@functools.partial(_deposit.defjvp, symbolic_zeros=True)
def _deposit_jvp(size, primals, tangents):
    weight, st = primals
    t_weight, t_frac = _nonzero(tangents[0]), _nonzero(tangents[1].frac)  # idx: no tangent
    out = _deposit(weight, st, size)
    if t_weight is None and t_frac is None:
        return out, jnp.zeros_like(out)
    # checkpointed: reverse mode keeps the inputs only (no [N, n^3] products) and recomputes
    # the weights next to its gather
    tangent = jax.checkpoint(functools.partial(_deposit_tangent, size=size))
    return out, tangent(weight, st, t_weight, t_frac)


# --------------------------------------------------------------------------- interpolation


@jax.custom_jvp
def _interp(flat: Array, st: Stencil) -> Array:
    """Interpolation of the flat padded block ``[M, C]`` at the local particles (stencil ``st``):
    ONE gather of the corners for all C components; returns ``[bx, by, nz, C]``."""
    dtype = jnp.result_type(flat.dtype, st.frac.dtype)
    w = _weights(st.frac, _points(st)).astype(dtype)
    return _corner_sum(_gather(flat, st.idx, dtype), [w[:, k] for k in range(w.shape[1])])


def _gather(flat: Array, idx: Array, dtype) -> Array:
    """The flat padded block ``[M, C]`` at the corners ``idx`` ``[bx, n^3, by, nz]``: ``[bx, n^3, by, nz, C]``."""
    return flat.at[idx].get(mode="promise_in_bounds").astype(dtype)


def _corner_sum(vals: Array, w: list) -> Array:
    """``sum_k vals[:, k] w[k]`` ``[bx, by, nz, C]`` over the corners of ``vals`` ``[bx, n^3, by, nz, C]``,
    for ``w`` a list of ``n^3`` arrays ``[bx, by, nz]``: unrolled, much faster forward on XLA CPU
    than a reduction over the corner axis (whose transpose, a broadcast, is the faster backward:
    :func:`_interp_tangent` uses it where only the transpose runs). Transposed with respect to
    ``w``, it reduces over the C components; with C = 1 there is nothing to reduce."""
    out = vals[:, 0] * w[0][..., None]
    for k in range(1, vals.shape[1]):
        out = out + vals[:, k] * w[k][..., None]
    return out


def _interp_tangent(flat, st, t_flat, t_frac):
    """Tangent of :func:`_interp` ``[bx, by, nz, C]``, linear in ``t_flat`` and ``t_frac``
    (None: zero), over slabs of whole x rows (:data:`CHUNK_PARTICLES`). Transposed, a slab is
    one scatter-add of ``w_k ct`` into the field's cotangent and one gather of the field for
    the positions' cotangent. Each slab is checkpointed: reverse mode keeps the inputs only
    and recomputes the slab's gathers and weights, so its ``[N, n^3, C]`` temporaries never
    exist for the whole block. The slabs are the scanned axis of the stencil, ``t_frac`` and
    the output (not slices of a loop carry), so that the transposed loop touches each slab's
    cotangent only."""
    dtype = jnp.result_type(flat.dtype, st.frac.dtype)
    bx, by, nz = st.idx.shape[0], st.idx.shape[2], st.idx.shape[3]
    rows = _rows_per_slab(bx, by, nz)
    n = _points(st)

    @jax.checkpoint
    def slab(flat, t_flat, s, tf):
        acc = None
        if t_flat is not None:  # the field's tangent read at the particles
            w = _weights(s.frac, n).astype(dtype)
            acc = jnp.sum(_gather(t_flat, s.idx, dtype) * w[..., None], axis=1)  # transposes to a broadcast
        if tf is not None:  # the weights' tangents times the field at the corners
            tw = [t.astype(dtype) for t in _weight_tangents(s.frac, tf, n)]
            vals = _gather(flat, s.idx, dtype)
            # unrolled over the corners and the components: transposed, no reduction (one over the
            # 3 components ran as XNNPACK reductions, 2.4x the whole gradient at the default size)
            a = jnp.stack([_corner_sum(vals[..., q, None], tw)[..., 0] for q in range(vals.shape[-1])], -1)
            acc = a if acc is None else acc + a
        return acc

    if rows == bx:
        return slab(flat, t_flat, st, t_frac)
    nslab = bx // rows

    def split(x):  # [bx, ...] -> [nslab, rows, ...]: contiguous, free
        return None if x is None else x.reshape((nslab, rows) + x.shape[1:])

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


# --------------------------------------------------------------------------- padded block


def padded_size(disp: Array, halo: int) -> int:
    bx, by, nz = disp.shape[:3]
    return (bx + 2 * halo) * (by + 2 * halo) * nz


def paint_padded(disp: Array, weight: Array | None, halo: int, st: Stencil) -> Array:
    """Local deposit into the padded block ``[bx+2h, by+2h, nz]`` with ONE scatter-add."""
    bx, by, nz = disp.shape[:3]
    return _deposit(weight, st, padded_size(disp, halo)).reshape(bx + 2 * halo, by + 2 * halo, nz)


def read_padded(padded: Array, st: Stencil) -> Array:
    """Interpolate the padded local block ``[bx+2h, by+2h, nz, C]`` at the particles of the
    stencil ``st``; returns ``[bx, by, nz, C]``."""
    return _interp(padded.reshape(-1, padded.shape[-1]), st)
