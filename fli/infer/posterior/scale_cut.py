"""A likelihood restricted to the scales the model gets right: each map's Fourier modes up to
``lensing.ell_max``, whitened under the mask.

The PM forward loses power past some multipole (docs/fidelity.md), so a fit to every pixel
asks the model to explain scales it cannot make. With ``lensing.ell_max = [l_0, l_1, ...]`` (one
per tomographic bin) the likelihood reads bin ``b`` only through the real Fourier components
of the masked map whose flat-sky multipole ``|ell| = 2 pi |k| / fov`` is at most ``l_b``.

For a map of ``N x N`` pixels, mode ``k = (k_x, k_y)`` contributes the two real rows
``cos(2 pi k.x / N)`` and ``sin(2 pi k.x / N)`` (one of each conjugate pair ``k, -k``; a mode
that is its own conjugate has no sine). Stacked, and multiplied by the mask ``m``, they form
``A [M, N^2]``. The data's components ``A d`` carry the noise ``A n`` with covariance
``sigma_b^2 A A^T``: diagonal without a mask, coupled with one. Its eigendecomposition
``A A^T = V diag(w) V^T`` gives the whitened rows

    B = diag(w)^(-1/2) V^T A / sigma_b,    U_like = 1/2 sum_b |B_b (kappa_b - d_b)|^2,

whose residual has unit covariance under the noise, whatever the mask. Directions of ``A A^T``
below ``1e-8`` of its largest eigenvalue (modes the mask leaves unobserved) are dropped. With
every mode kept and no mask, ``U_like`` is the pixel likelihood (Parseval; tested).

The rows are small: about ``pi (l fov / 2 pi)^2`` of them per bin (55 for ell 300 and 218 for
600 on the default 5-degree map), stored ``[n_bins, M_max, N, N]`` (zero rows pad the bins with
fewer) and sharded over the pixels like the maps, so the contraction is local with one
all-reduce of ``[n_bins, M_max]``.
"""

from __future__ import annotations

import math

import numpy as np

from fli.config import ConfigError

RCOND = 1e-8  # eigenvalues of A A^T below this fraction of the largest are unobserved directions


def check_ell_max(ell_max, n_bins: int) -> tuple[float, ...] | None:
    """``lensing.ell_max`` as one positive multipole per bin, or None (every pixel)."""
    if ell_max is None:
        return None
    vals = list(ell_max)
    if len(vals) != n_bins or not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in vals):
        raise ConfigError(f"lensing.ell_max must be null (every pixel) or one positive multipole per source bin "
                          f"({n_bins} bins), got {vals}")
    return tuple(float(v) for v in vals)


def _modes(npix: int, fov_deg: float, ell_max: float):
    """``(a, b, ell, own_conjugate)`` for one mode of each conjugate pair with ``|ell| <= ell_max``."""
    f = np.fft.fftfreq(npix, 1.0 / npix)  # signed integer frequencies
    fov = math.radians(fov_deg)
    for a in range(npix):
        for b in range(npix):
            conj = ((-a) % npix, (-b) % npix)
            ell = 2 * math.pi * math.hypot(f[a], f[b]) / fov
            if conj >= (a, b) and ell <= ell_max:  # a pair is taken at its first member
                yield a, b, ell, conj == (a, b)


def mode_rows(npix: int, fov_deg: float, ell_max: float) -> tuple[np.ndarray, np.ndarray]:
    """``(A [M, npix, npix], ell [M])``: the real cosine and sine rows of the Fourier modes with
    ``|ell| <= ell_max``, one of each conjugate pair, in float64 (no mask, unnormalised)."""
    idx = np.arange(npix)
    rows, ells = [], []
    for a, b, ell, own in _modes(npix, fov_deg, ell_max):
        phase = 2 * math.pi * (a * idx[:, None] + b * idx[None, :]) / npix
        rows.append(np.cos(phase))
        ells.append(ell)
        if not own:  # a mode that is its own conjugate is real: its sine row is zero
            rows.append(np.sin(phase))
            ells.append(ell)
    return np.stack(rows), np.asarray(ells)


def whitened_rows(npix: int, fov_deg: float, ell_max: float, mask: np.ndarray | None, sigma: float) -> np.ndarray:
    """``B [M', npix, npix]``: the rows of :func:`mode_rows`, masked and whitened so that ``B n``
    has unit covariance for pixel noise ``n`` of sd ``sigma`` (float64, host)."""
    a, _ = mode_rows(npix, fov_deg, ell_max)
    m = np.ones((npix, npix)) if mask is None else np.asarray(mask, float)
    a = (a * m).reshape(a.shape[0], -1)
    w, v = np.linalg.eigh(a @ a.T)
    keep = w > RCOND * w.max()
    return ((v[:, keep] / np.sqrt(w[keep])).T @ a / sigma).reshape(-1, npix, npix)


def cut_rows(kappa_shape, fov_deg: float, ell_max, mask, sigma) -> tuple[np.ndarray, list[int]]:
    """``([n_bins, M_max, npix, npix], [M_b])``: every bin's whitened rows, zero-padded to the
    longest (host, float64); ``sigma`` ``[n_bins]``; ``mask`` None, ``[npix, npix]`` or one per bin."""
    n_bins, npix, _ = kappa_shape
    masks = [None] * n_bins if mask is None else np.broadcast_to(np.asarray(mask, bool), kappa_shape)
    per = [whitened_rows(npix, fov_deg, ell_max[b], masks[b], float(sigma[b])) for b in range(n_bins)]
    counts = [p.shape[0] for p in per]  # each >= 1: the map's mean (ell = 0) is always kept
    out = np.zeros((n_bins, max(counts), npix, npix))
    for b, p in enumerate(per):
        out[b, : p.shape[0]] = p
    return out, counts


def n_modes(npix: int, fov_deg: float, ell_max) -> int:
    """The likelihood's terms without a mask: the real components kept in all bins."""
    return sum(1 if own else 2 for e in ell_max for *_, own in _modes(npix, fov_deg, e))
