"""The same universe on a finer grid: white noise whose large-scale modes are a coarser grid's.

Issue 22's model-error test pairs a mock made by the analysis model with one made by a finer
simulation of the same initial conditions. :func:`fli.sim.lpt.linear_modes` turns unit white noise
``s`` on ``N`` cells of volume ``V_cell`` into ``delta_k = FFT(s) sqrt(P / V_cell)``, and the
unnormalised DFT of one band-limited field on ``F`` times the cells is ``F`` times larger. So the
fine grid carries the coarse grid's linear field when, for every mode inside the coarse grid's
band (``|k_i| < N_i / 2`` on each axis; the coarse Nyquist planes are real there and are left
out), ``FFT_fine(s_fine)[k] = sqrt(F) FFT_coarse(s)[k]``, and every other mode is fresh noise.
Each mode then still has the variance ``N_fine`` of unit white noise, so ``s_fine`` is unit white
noise on the fine grid (tests/sim/test_refine.py).

Host numpy, for scripts that make paired mocks: a 128 x 128 x 256 field is 32 MB.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def refine_white_noise(coarse: np.ndarray, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Unit white noise of ``shape`` whose modes inside ``coarse``'s band are ``coarse``'s
    (float64); each axis of ``shape`` is a whole multiple of ``coarse``'s."""
    coarse = np.asarray(coarse, np.float64)
    nc, nf = coarse.shape, tuple(int(n) for n in shape)
    if len(nf) != 3 or any(f % c or f < c for f, c in zip(nf, nc, strict=True)):
        raise ValueError(f"a finer grid needs each axis a whole multiple of the coarse grid's {nc}, got {nf}")
    factor = np.prod(nf) / np.prod(nc)
    fine_k = np.fft.rfftn(rng.standard_normal(nf))
    coarse_k = np.fft.rfftn(coarse) * np.sqrt(factor)
    # the coarse band: signed frequencies strictly inside each axis's Nyquist (rfft axis: non-negative)
    inside = [np.abs(np.fft.fftfreq(n, 1.0 / n)) < n / 2 for n in nc[:2]]
    inside.append(np.arange(nc[2] // 2 + 1) < nc[2] / 2)
    for ix in np.flatnonzero(inside[0]):
        fx = ix if ix <= nc[0] // 2 else nf[0] - (nc[0] - ix)  # the same signed frequency on the fine grid
        for iy in np.flatnonzero(inside[1]):
            fy = iy if iy <= nc[1] // 2 else nf[1] - (nc[1] - iy)
            iz = np.flatnonzero(inside[2])
            fine_k[fx, fy, iz] = coarse_k[ix, iy, iz]
    return np.fft.irfftn(fine_k, s=nf, axes=(0, 1, 2))
