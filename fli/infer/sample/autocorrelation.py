"""Integrated autocorrelation times of short series, inside a compiled program.

MCLMC's warm-up sets its trajectory length ``L`` from how fast the chain decorrelates
(:mod:`fli.infer.sample.mclmc`): it records a few scalar projections of the position over its last
transitions and reads their autocorrelation times here. Everything has a fixed shape, so the
function runs inside the jitted step, on a buffer that is replicated and small ([steps, m]):
no [steps x latents] array is ever stored.

The estimator is Geyer's initial monotone sequence (Geyer 1992), the one ArviZ's and Stan's ESS
use on one chain: with ``rho_k`` the normalised autocovariance (by FFT), the pair sums
``P_k = rho_2k + rho_2k+1`` are summed up to the first that is not positive, after making them
non-increasing, and ``tau = -1 + 2 sum P_k``. The effective sample size is ``n / tau``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def autocorrelation_time(x, axis: int = 0):
    """The integrated autocorrelation time of each series of ``x`` along ``axis`` (at least 4
    steps long), in steps: ``n / ESS``. A constant series gets ``1``; ``tau`` is kept at or above
    ``1 / log10(n)``, ArviZ's floor for anticorrelated series."""
    x = jnp.moveaxis(jnp.asarray(x), axis, -1)
    n = x.shape[-1]
    if n < 4:
        raise ValueError(f"an autocorrelation time needs a series of 4 steps or more, got {n}")
    dx = x - jnp.mean(x, axis=-1, keepdims=True)
    f = jnp.fft.rfft(dx, n=2 * n, axis=-1)  # zero-padded: the linear, not the circular, autocovariance
    acov = jnp.fft.irfft(f * jnp.conj(f), n=2 * n, axis=-1)[..., :n] / n
    var0 = acov[..., :1]
    rho = jnp.where(var0 > 0, acov / jnp.where(var0 > 0, var0, 1.0), 0.0)
    m = n // 2
    pairs = rho[..., 0:2 * m:2] + rho[..., 1:2 * m:2]  # P_0 .. P_(m-1)
    positive = jnp.cumprod(pairs > 0, axis=-1).astype(x.dtype)  # up to the first that is not
    mono = jax.lax.cummin(jnp.where(positive > 0, pairs, jnp.inf), axis=pairs.ndim - 1)
    tau = -1.0 + 2.0 * jnp.sum(jnp.where(positive > 0, mono, 0.0), axis=-1)
    tau = jnp.where(var0[..., 0] > 0, tau, 1.0)
    return jnp.maximum(tau, 1.0 / jnp.log10(jnp.asarray(n, x.dtype)))

