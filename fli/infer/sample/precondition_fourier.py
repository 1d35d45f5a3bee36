r"""A Fourier-diagonal posterior preconditioner, for fields whose low-rank one does not fit.

Instead of the ``r`` field-sized vectors of :mod:`fli.infer.sample.precondition` it stores a small
table: the Gauss-Newton ``J^T J`` taken as diagonal in the field's Fourier modes, one value ``d``
per bin of transverse wavenumber ``|k_perp|`` (whole multiples of ``2 pi / L_x``) and line-of-sight
mode number ``|m_z|``:

.. math::

    C^{1/2} s = F^{-1} \big[(1 + d(k_\perp, k_\parallel))^{-1/2} \, F s\big] ,

a real, symmetric convolution. The bins keep ``k_parallel`` apart because the broad lensing kernel
fixes many transverse modes and few line-of-sight ones. theta and the tail's dummies keep their
unit prior scale (the joint Hessian's theta curvature is conditional on the field and 3x too
stiff, docs/map.md). :func:`build_fourier` probes ``d`` with white noise ``n`` (Hutchinson's estimator,
``d_b = sum_{k in b} Re(conj(n_k) (J^T J n)_k) / sum_{k in b} |n_k|^2``, exact for an operator
diagonal in the bins; 2 gradient evaluations a probe). Nothing gathers the field: each device
builds the factor on its own block of k-space, with the transforms of :mod:`fli.sim.fft`.

Not an ``inference.precondition``: on tiny it makes the Hessian far worse conditioned, so it is
kept as the instrument of ``scripts/studies/preconditioner_spectrum.py`` (docs/nuts.md, "A
preconditioned latent"; docs/benchmarks.md, "A Fourier-diagonal preconditioner").
"""

from __future__ import annotations

import logging
import math
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fli.sim.fft import box3
from fli.infer.posterior.model import Data, Posterior
from fli.sim.sharding import AXES

KIND = "fourier"


class FourierDiag(NamedTuple):
    """``z = ref + C^{1/2} y``, ``C^{1/2}`` the Fourier filter ``(1 + table[bin(k)])^{-1/2}`` on
    the field (theta and the dummies unscaled).

    Attributes:
        ref: ``[size]`` the flat latent it was built at (sharded like the latent).
        table: ``[n_perp, n_par]`` the estimated diagonal of ``J^T J`` per bin (>= 0, replicated).
    """

    ref: jax.Array
    table: jax.Array


def table_shape(post: Posterior) -> tuple[int, int]:
    """``(n_perp, n_par)``: transverse bins ``0 .. round(|k_perp|max / k_f)``, line-of-sight
    mode numbers ``0 .. nz // 2``."""
    nx, ny, nz = post.fwd.grid.shape
    lx, ly, _ = box3(post.fwd.grid.box)
    kf = 2 * np.pi / lx
    kmax = np.hypot(2 * np.pi * (nx // 2) / lx, 2 * np.pi * (ny // 2) / ly)
    return int(np.rint(kmax / kf)) + 1, nz // 2 + 1


def _bins(post: Posterior, local: bool):
    """``(perp, par)`` integer bin indices broadcastable to the (local) k-array."""
    grid = post.fwd.grid
    lx, _, lz = box3(grid.box)
    kx, ky, kz = grid.fft.kvec(grid.box, local=local, dtype=np.float64 if grid.dtype == np.float64 else np.float32)
    perp = jnp.rint(jnp.sqrt(kx * kx + ky * ky) / (2 * np.pi / lx)).astype(jnp.int32)
    par = jnp.rint(jnp.abs(kz) / (2 * np.pi / lz)).astype(jnp.int32)
    return perp, par


def filter_field(post: Posterior, table, s, power: float):
    """``F^{-1}[(1 + table[bin(k)])^power F s]`` for a field ``s`` (sharded like the grid);
    the factor is made on each device's block of k-space, never as a whole array."""
    plan = post.fwd.grid.fft

    def scale(sk, table):
        perp, par = _bins(post, local=True)
        return sk * jnp.power(1.0 + table[perp, par], power).astype(sk.real.dtype)

    sk = plan.rfft(s)
    sk = jax.shard_map(scale, mesh=plan.mesh, in_specs=(plan.kspec, P()), out_specs=plan.kspec)(sk, table)
    return plan.irfft(sk).astype(s.dtype)


def _apply(post: Posterior, pre: FourierDiag, x, power: float):
    lay = post.layout
    theta, s = lay.unpack(x)
    return lay.pack(theta, filter_field(post, pre.table, s, power), x)


def sqrt_cov(post: Posterior, pre: FourierDiag, y):
    """``C^{1/2} y`` for a flat latent ``y``."""
    return _apply(post, pre, y, -0.5)


def inv_sqrt_cov(post: Posterior, pre: FourierDiag, x):
    """``C^{-1/2} x``, the inverse of :func:`sqrt_cov`."""
    return _apply(post, pre, x, 0.5)


def to_z(post: Posterior, pre: FourierDiag, y):
    return pre.ref + sqrt_cov(post, pre, y)


def to_y(post: Posterior, pre: FourierDiag, z):
    return inv_sqrt_cov(post, pre, z - pre.ref)


# --------------------------------------------------------------------------- the estimate


def bin_sums(post: Posterior, a, b):
    """``(sum_bin w Re(conj(A) B), sum_bin w |A|^2)`` over the modes of each bin, ``A, B`` the
    FFTs of the fields ``a, b`` and ``w`` the modes each stored one stands for (so a bin counts
    the modes of the full FFT). Each device sums its own block; one all-reduce of two tables."""
    plan = post.fwd.grid.fft
    shape = table_shape(post)
    nbins = math.prod(shape)

    def local(ak, bk):
        perp, par = _bins(post, local=True)
        w = plan.hermitian_weight(local=True, dtype=ak.real.dtype)
        idx = jnp.broadcast_to(perp * shape[1] + par, ak.shape).reshape(-1)
        cross = jnp.broadcast_to(w * jnp.real(jnp.conj(ak) * bk), ak.shape).reshape(-1)
        power = jnp.broadcast_to(w * jnp.abs(ak) ** 2, ak.shape).reshape(-1)
        num = jax.ops.segment_sum(cross, idx, nbins)
        den = jax.ops.segment_sum(power, idx, nbins)
        return jax.lax.psum(num, AXES).reshape(shape), jax.lax.psum(den, AXES).reshape(shape)

    return jax.shard_map(local, mesh=plan.mesh, in_specs=(plan.kspec, plan.kspec), out_specs=(P(), P()))(
        plan.rfft(a), plan.rfft(b))


def build_fourier(post: Posterior, data: Data, ref, probes: int, key, log: logging.Logger | None = None,
                  chunk: int = 4, ad: str = "auto") -> tuple[FourierDiag, dict]:
    """:class:`FourierDiag` at the flat latent ``ref`` (from a fli-map run, never the truth)
    from ``probes`` white-noise probes of the Gauss-Newton ``J^T J`` there, ``chunk`` per
    compiled call (the forward linearised once a call), with a progress line after each.

    Returns the preconditioner and a summary: probes, gradient evaluations (2 a probe),
    seconds, and the table's largest value and how many bins exceed 1 (data-dominated)."""
    from fli.infer.fit.lowrank import call_with_ad, check_ad, jtj_operator  # noqa: PLC0415

    log = log or logging.getLogger("fli")
    check_ad(ad)
    lay, grid = post.layout, post.fwd.grid
    operator = jtj_operator(post)
    shape = table_shape(post)

    def sums(zs, data, key, first, n, ad):
        op = operator(zs, data, ad)

        def body(i, acc):
            n_field = jax.random.normal(jax.random.fold_in(key, first + i), grid.shape, grid.jdtype)
            n_field = jax.lax.with_sharding_constraint(n_field, grid.sharding)
            v = lay.pack(jnp.zeros((post.prior.n,), grid.jdtype), n_field)
            _, g = lay.unpack(op(v))
            num, den = bin_sums(post, n_field, g)
            return acc[0] + num, acc[1] + den

        zero = jnp.zeros(shape, grid.jdtype)
        return jax.lax.fori_loop(0, n, body, (zero, zero))

    programs = {r: jax.jit(lambda zs, data, key, first, n, r=r: sums(zs, data, key, first, n, r)) for r in
                ("forward", "reverse")}
    at = ref[None]
    t0 = time.perf_counter()
    num = den = np.zeros(shape)
    done = 0
    while done < probes:
        n = min(chunk, probes - done)
        (a, b), ad = call_with_ad(programs, ad, at, data, key, jnp.int32(done), jnp.int32(n))
        num, den = num + np.asarray(a, np.float64), den + np.asarray(b, np.float64)
        done += n
        log.info("preconditioner: Fourier probe %d/%d (%.1f s)", done, probes, time.perf_counter() - t0)
    table = np.clip(np.divide(num, den, out=np.zeros(shape), where=den > 0), 0.0, None)
    pre = FourierDiag(ref, jax.device_put(jnp.asarray(table, grid.jdtype), NamedSharding(grid.mesh, P())))
    seconds = time.perf_counter() - t0
    info = {"kind": KIND, "probes": int(probes), "points": 1, "grad_evals": 2 * int(probes), "seconds": seconds,
            "ad": ad, "bins": list(shape), "table_max": float(table.max()),
            "bins_data_dominated": int((table > 1).sum())}
    log.info("preconditioner: Fourier-diagonal from %d probes in %.1f s (%d gradient evaluations); J^T J per "
             "(k_perp, k_par) bin up to %.3g, above 1 (the data's) in %d of %d bins", probes, seconds, 2 * probes,
             info["table_max"], info["bins_data_dominated"], math.prod(shape))
    return pre, info
