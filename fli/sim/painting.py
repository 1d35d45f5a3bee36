"""Painting particles onto the sharded mesh and reading fields at them (CIC or TSC).

Layout (:mod:`fli.sim.sharding`): mesh ``('x', 'y')`` of shape ``(px, py)``; a field ``[nx, ny, nz]``
sharded ``P('x', 'y')``, each device holding ``[bx, by, nz]`` (``bx = nx // px``, ``by = ny // py``),
axis 2 local and periodic. One particle per grid cell, stored as its displacement from its
Lagrangian cell IN UNITS OF GRID CELLS: particle ``(i, j, k)`` sits at ``(i + dx, j + dy, k + dz)``,
``disp[i, j, k] = (dx, dy, dz)``, in the periodic box (cell centres at integers). ``disp``
``[nx, ny, nz, 3]`` is sharded like the fields: a particle is painted and read by the device that
owns its Lagrangian cell. The scheme (:mod:`fli.sim.assignment`) is ``"cic"`` (8 corners) or
``"tsc"`` (27, with the continuous derivative a gradient-based fit needs; docs/muse_studies.md).

Halo: each device paints into its block padded by ``halo`` cells in x and y. A footprint fits when
the transverse displacement ``|d| < halo`` (CIC; exactly ``-halo <= d < halo``) or
``|d| < halo - 1/2`` (TSC); :func:`required_halo` gives a halo that is enough. A particle beyond is
clipped onto the outermost padded cells: its mass is kept (total mass is exact) but misplaced, it
reads the field there, and its gradient in the clipped component is 0. Nothing inside ``jit`` can
raise, so callers carry :func:`max_displacement` out of the run and call :func:`check_halo` on the
host. Exchanges are in :mod:`fli.sim.halo`. Every mode of differentiation works and composes:
``grad``, ``jvp``, and Hessian-vector products forward-over-reverse or reverse-over-reverse.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from fli.sim.assignment import SCHEMES, Stencil, check_scheme, local_stencil, paint_padded, read_padded
from fli.sim.halo import (
    any_exchanged,
    check_blocks,
    fold_exchange,
    fold_local,
    jaxdecomp_ops,
    pad_local,
    wrap_pad_local,
)
from fli.sim.sharding import FIELD_SPEC, mesh_pdims

__all__ = [
    "SCHEMES",
    "Stencil",
    "make_stencil",
    "paint",
    "read",
    "max_displacement",
    "check_halo",
    "required_halo",
]

OVERFLOW_POLICIES = ("raise", "warn")

Array = jax.Array

# a stencil's arrays [x, corner or coordinate, y, z] (fli.sim.assignment.LAYOUT), sharded like the particles
STENCIL_SPEC = P("x", None, "y")


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


def _reach(scheme: str) -> float:
    """How much further than the displacement a footprint reaches past the nearest point: CIC 0,
    TSC 1/2 (its footprint is centred on the nearest grid point, one point each side)."""
    return 0.0 if check_scheme(scheme) == 2 else 0.5


def required_halo(max_disp: float, scheme: str = "cic") -> int:
    """Smallest halo (cells) whose padded block holds every footprint: ``floor(max) + 1`` (CIC),
    ``floor(max + 1/2) + 1`` (TSC)."""
    return int(math.floor(float(max_disp) + _reach(scheme))) + 1


def check_halo(max_disp, halo: int, policy: str = "raise", scheme: str = "cic") -> bool:
    """Host-side check of a measured :func:`max_displacement` against the halo width.

    Returns True when every footprint of ``scheme`` fitted in the padded blocks
    (``max_disp < halo``, TSC ``max_disp < halo - 1/2``).
    Otherwise, with ``policy="raise"`` raises ``ValueError``, with ``policy="warn"`` emits a
    ``RuntimeWarning`` and returns False. Overflowing particles were clipped onto the outermost
    halo cell: mass was conserved but misplaced, and the forces they read were wrong.
    A NaN displacement counts as an overflow.
    """
    if policy not in OVERFLOW_POLICIES:
        raise ValueError(f"on_overflow policy must be one of {OVERFLOW_POLICIES}, got {policy!r}")
    m = float(np.asarray(max_disp))
    if m < halo - _reach(scheme):  # False for NaN
        return True
    need = required_halo(m, scheme) if math.isfinite(m) else "(undefined: displacements are not finite)"
    msg = (
        f"particles moved {m:.4g} cells but halo is {halo} cells: increase simulation.halo to "
        f">= {need} ({scheme} footprints; overflowing particles were clipped to the halo edge: mass "
        f"conserved, positions and forces wrong)"
    )
    if policy == "raise":
        raise ValueError(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=2)
    return False


# --------------------------------------------------------------------------- paint / read


def _given_stencil(stencil: Stencil | None, scheme: str) -> tuple | None:
    """A caller's shared stencil as the jitted kernels take it, refused if it is another scheme's."""
    check_scheme(scheme)
    if stencil is None:
        return None
    if stencil.scheme != scheme:
        raise ValueError(f"the stencil given is {stencil.scheme}'s but scheme is {scheme!r}: make it with "
                         f"make_stencil(..., scheme={scheme!r})")
    return tuple(stencil)


@functools.partial(jax.jit, static_argnames=("mesh", "halo", "exchange", "scheme"))
def _paint(disp, weight, stencil, *, mesh, halo, exchange, scheme):
    pdims = mesh_pdims(mesh)
    args = (disp, weight, stencil)
    specs = (FIELD_SPEC, None if weight is None else FIELD_SPEC, None if stencil is None else STENCIL_SPEC)

    def padded_local(d, w, st):
        return paint_padded(d, w, halo, local_stencil(d, halo, scheme) if st is None else Stencil(*st))

    if exchange == "ppermute":

        def local(*a):
            return fold_local(padded_local(*a), halo, pdims)

        return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=FIELD_SPEC)(*args)
    padded = jax.shard_map(padded_local, mesh=mesh, in_specs=specs, out_specs=FIELD_SPEC)(*args)
    return fold_exchange(padded, mesh, halo, exchange)


def make_stencil(disp: Array, mesh: Mesh, halo: int, scheme: str = "cic") -> Stencil:
    """The :class:`Stencil` of the particles ``disp`` (cells), sharded ``P('x', None, 'y')``, to pass to
    :func:`paint` and :func:`read` at the same positions (as the PM force does): computed once
    instead of in each of them and again in each adjoint."""
    _check_disp(disp)
    check_scheme(scheme)
    check_blocks(disp.shape[:3], mesh, halo, "ppermute", "disp")
    return _stencil_global(disp, mesh=mesh, halo=int(halo), scheme=scheme)


@functools.partial(jax.jit, static_argnames=("mesh", "halo", "scheme"))
def _stencil_global(disp, *, mesh, halo, scheme):
    return Stencil(*jax.shard_map(lambda d: tuple(local_stencil(d, halo, scheme)), mesh=mesh, in_specs=FIELD_SPEC,
                                  out_specs=STENCIL_SPEC)(disp))


def paint(
    disp: Array,
    mesh: Mesh,
    halo: int,
    weight: Array | None = None,
    *,
    exchange: str = "ppermute",
    stencil: Stencil | None = None,
    scheme: str = "cic",
) -> Array:
    """Mass per cell ``[nx, ny, nz]`` (sharded ``P('x', 'y')``) of one particle per cell.

    Args:
        disp: displacements ``[nx, ny, nz, 3]`` in cells, sharded ``P('x', 'y')``; the result
            has its dtype.
        mesh: the ``('x', 'y')`` device mesh.
        halo: padding in cells, ``1 <= halo <= min(bx, by)``; must exceed every ``|dx|, |dy|``
            (TSC: by 1/2; see :func:`check_halo`); particles beyond it are clipped to the halo edge.
        weight: optional mass per particle ``[nx, ny, nz]`` (default 1: an unperturbed lattice
            paints 1 in every cell).
        exchange: ``"ppermute"`` (default) or ``"jaxdecomp"``.
        stencil: :func:`make_stencil` of ``disp`` with the same mesh, halo and scheme, when the
            caller shares one between painting and reading (default: computed here).
        scheme: the mass assignment, ``"cic"`` (default) or ``"tsc"`` (:mod:`fli.sim.assignment`).

    Differentiable with respect to ``disp`` and ``weight``. Shapes and the halo are checked
    here, before anything is traced.
    """
    grid = _check_disp(disp)
    check_blocks(grid, mesh, halo, exchange, "disp")
    if weight is not None and tuple(weight.shape) != grid:
        raise ValueError(f"weight must have shape {grid}, got {tuple(weight.shape)}")
    st = _given_stencil(stencil, scheme)
    return _paint(disp, weight, st, mesh=mesh, halo=int(halo), exchange=exchange, scheme=scheme)


@functools.partial(jax.jit, static_argnames=("mesh", "halo", "exchange", "layout", "scheme"))
def _read(fields, disp, stencil, *, mesh, halo, exchange, layout, scheme):
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

    sspec = None if stencil is None else STENCIL_SPEC

    def stencil_of(d, st):
        return local_stencil(d, halo, scheme) if st is None else Stencil(*st)

    if exchange == "ppermute":

        def local(f, d, st):
            return read_padded(pad_local(to_last(f), halo, pdims), stencil_of(d, st))

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
        return read_padded(g.reshape(g.shape[0], g.shape[1], nz, ncomp), stencil_of(d, st))

    out = jax.shard_map(local_read, mesh=mesh, in_specs=(FIELD_SPEC, FIELD_SPEC, sspec), out_specs=FIELD_SPEC)(
        padded, disp, stencil
    )
    return out[..., 0] if layout == "single" else out


def read(
    field: Array | Sequence[Array],
    disp: Array,
    mesh: Mesh,
    halo: int,
    *,
    exchange: str = "ppermute",
    stencil: Stencil | None = None,
    scheme: str = "cic",
) -> Array:
    """Interpolation (periodic; CIC trilinear, TSC quadratic) of field(s) at the particles.

    ``field`` is one field ``[nx, ny, nz]`` -> returns ``[nx, ny, nz]``; or ``C`` components as
    ``[C, nx, ny, nz]`` or a tuple of ``C`` fields -> returns ``[nx, ny, nz, C]``, read in one
    pass (one exchange of the padded blocks, one gather of the corners for all components).
    ``disp``, ``mesh``, ``halo``, ``exchange``, ``stencil``, ``scheme``: as in :func:`paint`, of which this is the
    transpose for fixed positions: ``<paint(d, w), f> == <w, read(f, d)>``. Differentiable
    with respect to the field(s) and ``disp``.
    """
    grid = _check_disp(disp)
    check_blocks(grid, mesh, halo, exchange, "disp")
    if isinstance(field, (tuple, list)):
        fields = tuple(field)
        if not fields:
            raise ValueError("read needs at least one field")
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
    return _read(fields, disp, _given_stencil(stencil, scheme), mesh=mesh, halo=int(halo), exchange=exchange,
                 layout=layout, scheme=scheme)
