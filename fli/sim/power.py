"""Shell-averaged power spectra and cross-correlation coefficients of sharded 3D fields.

Conventions: a field ``delta[nx, ny, nz]`` in a box ``(Lx, Ly, Lz)`` Mpc/h with ``N = nx ny nz``
cells and ``V = Lx Ly Lz`` has ``P(k) = V / N^2 <|delta_k|^2>`` in (Mpc/h)^3, with ``delta_k``
the unnormalised FFT (``numpy.fft.fftn``). White noise of unit variance per cell therefore has
``P = V / N`` (the cell volume). Modes are averaged in shells of ``|k|`` (h/Mpc): a mode
belongs to bin b when ``edges[b] <= |k| < edges[b + 1]``; the k = 0 mode is never counted.
Each stored mode counts with its :meth:`fli.sim.fft.FFTPlan.hermitian_weight`, so results and mode
counts are those of the full complex FFT whatever the backend.

Default bins: width ``kf = min_i 2 pi / L_i`` (the fundamental), centred on ``kf, 2 kf, ...``
(edges ``kf (j + 1/2)``), up to the Nyquist wavenumber ``k_N = min_i pi n_i / L_i``.

The sums run inside one ``shard_map`` (local binning, then ``psum`` over the mesh), so nothing
is gathered. Box sizes and bin edges must be concrete (not traced); the fields may be traced,
and the results are differentiable in them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from fli.sim.fft import FFTPlan, box3, kgrid_norm

__all__ = ["default_kedges", "power_spectrum", "cross_correlation", "binned_spectra"]


def default_kedges(plan: FFTPlan, box, nbins: int | None = None) -> np.ndarray:
    """Bin edges in h/Mpc: fundamental-width bins centred on multiples of ``kf`` up to Nyquist.

    With ``nbins``, the same range ``[kf / 2, (j_max + 1/2) kf]`` cut into ``nbins`` equal bins.
    """
    L = box3(box)
    kf = min(2.0 * np.pi / Li for Li in L)
    knyq = min(np.pi * n / Li for n, Li in zip(plan.shape, L, strict=False))
    jmax = max(int(np.floor(knyq / kf + 1e-9)), 1)
    if nbins is None:
        return kf * (np.arange(jmax + 1) + 0.5)
    if int(nbins) < 1:
        raise ValueError(f"nbins must be positive, got {nbins!r}")
    return np.linspace(0.5 * kf, (jmax + 0.5) * kf, int(nbins) + 1)


def _edges(plan: FFTPlan, box, kedges) -> np.ndarray:
    if kedges is None or np.ndim(kedges) == 0:
        return default_kedges(plan, box, None if kedges is None else int(kedges))
    e = np.asarray(kedges, dtype=np.float64)
    if e.ndim != 1 or e.size < 2 or np.any(np.diff(e) <= 0):
        raise ValueError("kedges must be an increasing 1D sequence of at least two edges")
    return e


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _binned(plan: FFTPlan, box: tuple, edges: tuple, *fks):
    """Per-bin (sum w, sum w |k|, sum w Re(a b*) for each pair (a, b) in pairs of fks)."""
    nb = len(edges) - 1
    npair = len(fks) // 2

    def local(*ks):
        rdt = jnp.real(ks[0]).dtype
        kn = kgrid_norm(plan, box, local=True, dtype=rdt)
        w = plan.hermitian_weight(local=True, dtype=rdt)
        e = jnp.asarray(edges, dtype=rdt)
        idx = jnp.searchsorted(e, kn, side="right") - 1
        idx = jnp.where((idx < 0) | (idx >= nb) | (kn <= 0), nb, idx)
        shape = jnp.broadcast_shapes(kn.shape, w.shape, ks[0].shape)
        idx = jnp.broadcast_to(idx, shape).reshape(-1)
        w = jnp.broadcast_to(w, shape)
        cols = [w, w * kn]
        for i in range(npair):
            a, b = ks[2 * i], ks[2 * i + 1]
            cols.append(w * jnp.real(a * jnp.conj(b)))
        vals = jnp.stack([jnp.broadcast_to(c, shape).reshape(-1) for c in cols], axis=-1)
        sums = jax.ops.segment_sum(vals, idx, num_segments=nb + 1)[:nb]
        return jax.lax.psum(sums, ("x", "y"))

    f = jax.shard_map(
        local, mesh=plan.mesh, in_specs=(plan.kspec,) * len(fks), out_specs=P(), check_vma=False
    )
    return f(*fks)


def binned_spectra(
    plan: FFTPlan,
    box,
    pairs: Sequence[tuple[jax.Array, jax.Array]],
    kedges=None,
):
    """Shell averages of cross spectra of k-space fields (layout of ``plan``).

    ``pairs``: ``[(a_k, b_k), ...]``. Returns ``(k_mean, [P_ab, ...], n_modes)`` with
    ``P_ab = V / N^2 <Re(a_k conj(b_k))>``; empty bins give ``k`` = the bin centre and P = 0.
    """
    L = box3(box)
    edges = _edges(plan, box, kedges)
    fks = [f for pair in pairs for f in pair]
    for f in fks:
        if f.shape != plan.kshape:
            raise ValueError(f"k-space field of shape {f.shape}, plan expects {plan.kshape}")
    sums = _binned(plan, L, tuple(float(e) for e in edges), *fks)
    n = sums[:, 0]
    has = n > 0
    inv_n = jnp.where(has, 1.0 / jnp.where(has, n, 1.0), 0.0)
    centres = jnp.asarray(0.5 * (edges[1:] + edges[:-1]), dtype=n.dtype)
    k_mean = jnp.where(has, sums[:, 1] * inv_n, centres)
    N = float(np.prod(plan.shape))
    V = float(np.prod(L))
    spectra = [sums[:, 2 + i] * inv_n * (V / N**2) for i in range(len(pairs))]
    return k_mean, spectra, n


def power_spectrum(
    field: jax.Array,
    plan: FFTPlan,
    box,
    kedges=None,
    field2: jax.Array | None = None,
):
    """Shell-averaged (cross) power spectrum of real field(s) ``[nx, ny, nz]``.

    ``kedges``: None (default bins, see module doc), a number of bins over the default range,
    or explicit increasing edges in h/Mpc. With ``field2`` it is the cross spectrum
    ``V / N^2 <Re(delta1_k conj(delta2_k))>``. Returns ``(k_mean, P, n_modes)``: the mode-weighted
    mean ``|k|`` per bin (h/Mpc), ``P`` in (Mpc/h)^3 and the number of modes of the full FFT in
    each bin.
    """
    f1 = plan.rfft(field)
    f2 = f1 if field2 is None else plan.rfft(field2)
    k, (p,), n = binned_spectra(plan, box, [(f1, f2)], kedges)
    return k, p, n


def cross_correlation(
    field1: jax.Array,
    field2: jax.Array,
    plan: FFTPlan,
    box,
    kedges=None,
):
    """Cross-correlation coefficient ``r(k) = P12 / sqrt(P11 P22)`` in shells of ``|k|``.

    Returns ``(k_mean, r)``; ``r = 0`` in empty bins and where either auto spectrum is 0.
    """
    a = plan.rfft(field1)
    b = plan.rfft(field2)
    k, (p11, p22, p12), _ = binned_spectra(plan, box, [(a, a), (b, b), (a, b)], kedges)
    den = p11 * p22
    pos = den > 0
    r = jnp.where(pos, p12 / jnp.sqrt(jnp.where(pos, den, 1.0)), 0.0)
    return k, r
