"""A potential-gradient-descent shift of the particles before they are painted onto lens planes.

The PM resolves forces only on the particle grid, so its haloes are too puffy and the map's
small-scale power falls short (docs/fidelity.md). Dai, Feng & Seljak (2018, arXiv:1804.00671)
mimic the missing short-range force with one gradient step of an effective potential: each
particle moves by

    S = -alpha(a) grad phi,   lap phi = O(k) delta,   O(k) = exp(-(k_l / k)^2) exp(-(k / k_s)^4)

i.e. ``S(k) = alpha i k O(k) delta(k) / k^2``, towards the overdensities, with a high-pass
``k_l`` that leaves the large scales alone and a low-pass ``k_s`` that stops at the grid's noise.
``alpha(a) = alpha_0 a^mu``. The shift is applied only to the positions that are painted: the
dynamics are untouched. It reuses the FFT of the density the PM step has already painted and
its particles' stencil, and costs three inverse FFTs and one read per plane. Its parameters are fitted once
(``scripts/studies/plane_fidelity.py --pgd``, docs/fidelity.md) on seeds and a cosmology that the
validation does not use.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fli.sim.fft import _default_float, _k2, gradient_kernel
from fli.sim.painting import Stencil, read


class PGDParams(NamedTuple):
    """alpha(a) = alpha * a^mu (dimensionless); k_l, k_s in h/Mpc. ``alpha = 0`` is off."""

    alpha: float = 0.0
    mu: float = 1.0
    kl: float = 0.1
    ks: float = 1.0


def pgd_filter(plan, box, kl: float, ks: float, dtype=None) -> jax.Array:
    """``O(k) / k^2`` on the rfft grid (0 at k = 0)."""
    k2 = _k2(plan, box, False, _default_float(dtype))
    pos = k2 > 0
    k2s = jnp.where(pos, k2, 1.0)
    o = jnp.exp(-(kl ** 2) / k2s) * jnp.exp(-(k2s / ks ** 2) ** 2)
    return jnp.where(pos, o / k2s, 0.0)


def pgd_shift(density_k, disp, a, grid, params: PGDParams, *, stencil: Stencil | None = None):
    """``S`` at each particle, ``[nx, ny, nz, 3]`` [Mpc/h] like ``disp`` (sharded ``P('x', 'y')``).

    ``density_k`` is ``grid.fft.rfft`` of the particle count per cell at ``disp`` [Mpc/h] (its
    mean does not matter: the filter is 0 at k = 0); ``a`` the scale factor (traceable);
    ``stencil`` the stencil of ``disp / grid.cell``, where the PM force has made one
    (:class:`fli.sim.nbody.Density`)."""
    plan, box = grid.fft, grid.box
    dk = density_k * pgd_filter(plan, box, params.kl, params.ks, dtype=grid.dtype)
    comps = jnp.stack([plan.irfft(gradient_kernel(plan, box, i, dtype=grid.dtype) * dk) for i in range(3)])
    cells = disp / jnp.asarray(grid.cell, disp.dtype)
    s = read(comps, cells, grid.mesh, grid.halo, stencil=stencil, scheme=grid.assignment)
    alpha = params.alpha * jnp.asarray(a, disp.dtype) ** params.mu
    return (alpha * s).astype(disp.dtype)
