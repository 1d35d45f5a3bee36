"""Linear density field and Lagrangian perturbation theory (Zel'dovich and 2LPT).

Conventions (see :mod:`fli.cosmo.background` for the growth factors):

.. math::

    \\Psi(q, a) = -D_1(a)\\,\\nabla\\phi_1 + D_2(a)\\,\\nabla\\phi_2, \\qquad
    \\nabla^2\\phi_1 = \\delta_L(q), \\qquad
    \\nabla^2\\phi_2 = \\sum_{i>j} \\left(\\phi_{1,ii}\\phi_{1,jj} - \\phi_{1,ij}^2\\right)

with :math:`\\delta_L` the linear field at :math:`a = 1` and :math:`D_2 \\to -3/7 D_1^2` early
(Bouchet et al. 1995; Scoccimarro 1998). Momenta are :math:`p = a^3 E\\, dx/da`
[Mpc/h, in units of H0], so :math:`p = G_f \\Psi_1 + G_{f2} \\Psi_2` with
:math:`G_f = a^3 E\\, dD_1/da`.

Every 3D field is ``[nx, ny, nz]`` sharded ``P('x', 'y')``; vector fields are
``[nx, ny, nz, 3]`` with the same sharding on the first two axes.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array

from fli.cosmo import background as cosmo_mod
from fli.cosmo.background import Cosmology
from fli.sim.fft import gradient_kernel, inv_laplace_kernel, kgrid_norm
from fli.sim.grid import Grid
from fli.cosmo.linear_power import linear_power


def linear_modes(cosmo: Cosmology, noise: Array, grid: Grid) -> Array:
    """Fourier modes of the linear density contrast at a = 1 from unit white noise.

    ``delta_k = FFT(noise) * sqrt(P(k, a=1) / V_cell)``: for unit-variance noise per cell the
    discrete field then has power ``V / N^2 <|delta_k|^2> = P(k)``. The k = 0 mode is zero.

    Args:
        noise: ``[nx, ny, nz]`` unit Gaussian white noise, sharded ``P('x', 'y')``.
    Returns:
        complex k-space array in the layout of ``grid.fft``.
    """
    plan = grid.fft
    k = kgrid_norm(plan, grid.box, dtype=grid.dtype)
    pk = linear_power(cosmo, k, 1.0)
    pos = k > 0  # double where: sqrt'(0) is infinite, so keep k = 0 out of the sqrt entirely
    amp = jnp.where(pos, jnp.sqrt(jnp.where(pos, pk, 1.0) / grid.cell_volume), 0.0)
    amp = amp * plan.valid(dtype=grid.dtype)
    return plan.rfft(noise.astype(grid.jdtype)) * amp.astype(grid.jdtype)


def linear_field(cosmo: Cosmology, noise: Array, grid: Grid, a: float | Array = 1.0) -> Array:
    """Linear density contrast ``D1(a) delta_L`` in real space, ``[nx, ny, nz]`` ``P('x','y')``."""
    d1 = cosmo_mod.growth_factor(cosmo, jnp.asarray(a, grid.jdtype))
    return grid.fft.irfft(linear_modes(cosmo, noise, grid)) * d1


def lpt_fields(delta_k: Array, grid: Grid, order: int = 2) -> tuple[Array, Array | None]:
    """Growth-free displacement fields ``Psi1 = -grad phi1`` and ``Psi2 = grad phi2`` [Mpc/h].

    Costs 3 inverse FFTs for first order, and 6 + 1 + 3 more for second order.
    Returns ``(psi1, psi2)``, each ``[nx, ny, nz, 3]``; ``psi2`` is None when ``order == 1``.
    """
    plan = grid.fft
    phi1_k = delta_k * inv_laplace_kernel(plan, grid.box, dtype=grid.dtype)  # phi1 = lap^-1 delta
    grads = [gradient_kernel(plan, grid.box, i, dtype=grid.dtype) for i in range(3)]
    psi1 = jnp.stack([plan.irfft(-g * phi1_k) for g in grads], axis=-1)
    if order == 1:
        return psi1, None
    # second derivatives phi_ij (i <= j): 6 inverse FFTs
    hess = {}
    for i in range(3):
        for j in range(i, 3):
            hess[i, j] = plan.irfft(grads[i] * grads[j] * phi1_k)
    src = (
        hess[0, 0] * hess[1, 1] + hess[0, 0] * hess[2, 2] + hess[1, 1] * hess[2, 2]
        - hess[0, 1] ** 2 - hess[0, 2] ** 2 - hess[1, 2] ** 2
    )
    phi2_k = plan.rfft(src) * inv_laplace_kernel(plan, grid.box, dtype=grid.dtype)
    psi2 = jnp.stack([plan.irfft(g * phi2_k) for g in grads], axis=-1)
    return psi1, psi2


def lpt(cosmo: Cosmology, delta_k: Array, grid: Grid, a: float | Array, order: int = 2) -> tuple[Array, Array]:
    """LPT displacements and momenta of the particles at scale factor ``a``.

    Returns:
        ``(disp, mom)``: displacement from the Lagrangian cell centre [Mpc/h] and momentum
        ``p = a^3 E dx/da`` [Mpc/h H0], each ``[nx, ny, nz, 3]`` sharded ``P('x', 'y')``.
    """
    a = jnp.asarray(a, grid.jdtype)
    psi1, psi2 = lpt_fields(delta_k, grid, order)
    t = cosmo_mod.growth_table(cosmo)
    disp = cosmo_mod.growth_factor(cosmo, a, table=t) * psi1
    mom = cosmo_mod.growth_Gf(cosmo, a, table=t) * psi1
    if psi2 is not None:
        disp = disp + cosmo_mod.growth_factor_second(cosmo, a, table=t) * psi2
        mom = mom + cosmo_mod.growth_Gf2(cosmo, a, table=t) * psi2
    return disp.astype(grid.jdtype), mom.astype(grid.jdtype)
