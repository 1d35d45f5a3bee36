"""Weak lensing: flat-sky lens planes from the PM box, Born convergence, lensing efficiency.

The light cone (where the planes lie, when they are crossed, the validation of the geometry:
:class:`~fli.lensing.light_cone.LensGeometry`, :func:`~fli.lensing.light_cone.lens_geometry`) is described in
:mod:`fli.lensing.light_cone`; its public names are importable from here too.

What the driver calls, in order
-------------------------------
1. ``bins = fli.lensing.survey.nz_bins_from_config(cfg.survey)`` and
   ``geom = lens_geometry(cosmo_fid, grid, cfg.lensing, cfg.survey)`` (host side, validates;
   :mod:`fli.lensing.light_cone`);
2. ``a_steps = geom.a_steps(cfg.simulation.a_start)`` -> ``[n_used + 1]`` increasing: the PM
   step ``j`` ends at the crossing time of plane ``n_used - 1 - j`` (farthest plane first);
3. ``hook = plane_hook(geom, grid)`` and ``nbody(..., a_steps, grid, hook=hook)``: the stacked
   observables are the planes ``[n_used, nx, ny]`` in *step order* (farthest first), each the
   density contrast integrated over its slab [Mpc/h];
4. ``kappa = born_convergence(cosmo, planes, geom, grid, bins)`` -> ``[n_bins, npix, npix]``
   sharded ``P(None, 'x', 'y')``;
5. mocks (:mod:`fli.lensing.survey`): ``sigma = noise_sigma(cfg.survey, fov, npix)``,
   ``obs = add_noise(key, kappa, sigma, load_mask(cfg.survey, npix))``.

n(z) bins and noise live in :mod:`fli.lensing.survey`; Limber predictions and the map power
spectrum in :mod:`fli.lensing.limber`.

Units: lengths in Mpc/h, angles in radians inside the code (``fov_deg`` in degrees, pixel
areas in arcmin^2 or sr as named), ``n_gal`` in galaxies per arcmin^2.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fli.cosmo.background import (
    C_OVER_H0,
    Cosmology,
    a_of_chi,
    comoving_distance,
)
from fli.lensing.light_cone import (  # noqa: F401  (the light cone's public names are fli.lensing.born's too)
    LensGeometry,
    ReplicationWarning,
    _check_grid,
    lens_geometry,
)
from fli.sim.sharding import FIELD_SPEC
from fli.lensing.survey import NzBin, as_bin_list, result_dtype, stack_bins

KAPPA_SPEC = P(None, "x", "y")  # [n_bins, npix, npix] maps and [n_planes, nx, ny] plane stacks


@jax.jit
def lensing_efficiencies(cosmo: Cosmology, nz_bins: Sequence[NzBin], chi):
    """g_b(chi) = int dz n_b(z) max(0, (chi(z) - chi) / chi(z)) for every bin: ``[n_bins, *chi.shape]``.

    Fixed-grid trapezoid quadrature on each bin's z grid; differentiable in ``cosmo`` (and in
    the n(z) values).  ``chi`` in Mpc/h.
    """
    dt = result_dtype(cosmo, chi)
    chi = jnp.asarray(chi, dt)
    z, w = stack_bins(nz_bins, dt)
    chi_z = comoving_distance(cosmo, 1.0 / (1.0 + z))  # [n_bins, N]
    pos = chi_z > 0
    cz = jnp.where(pos, chi_z, 1.0)
    c = chi[..., None, None]  # [..., 1, 1]
    ker = jnp.where(pos, jnp.maximum(0.0, 1.0 - c / cz), 0.0)  # [..., n_bins, N]
    g = jnp.sum(ker * w, axis=-1)  # [..., n_bins]
    return jnp.moveaxis(g, -1, 0)


def lensing_efficiency(cosmo: Cosmology, nz_bin: NzBin, chi):
    """g(chi) of one bin, shape of ``chi`` (see :func:`lensing_efficiencies`)."""
    return lensing_efficiencies(cosmo, [nz_bin], chi)[0]


@jax.jit
def lensing_kernel(cosmo: Cosmology, nz_bins: Sequence[NzBin], chi):
    """q_b(chi) = 1.5 Omega_m (H0/c)^2 chi / a(chi) g_b(chi) [h/Mpc], ``[n_bins, *chi.shape]``.

    kappa_b = int dchi q_b(chi) delta(chi theta, chi); the Born weight of plane i is
    q_b(r_i) (the plane holds delta integrated over its slab)."""
    dt = result_dtype(cosmo, chi)
    chi = jnp.asarray(chi, dt)
    a = a_of_chi(cosmo, chi)
    g = lensing_efficiencies(cosmo, nz_bins, chi)
    om = jnp.asarray(cosmo.Omega_m, dt)
    return 1.5 * om / C_OVER_H0 ** 2 * chi / a * g


# ============================================================================ lens planes


def plane_hook(geometry: LensGeometry, grid):
    """Per-step PM hook ``hook(density, disp, a, step) -> plane``.

    ``density`` is the PM force's :class:`fli.sim.nbody.Density`, whose ``rho`` is the particle
    count per cell ``[nx, ny, nz]`` (mean 1) sharded ``P('x', 'y')``; the hook returns, for
    step ``j``, the slab of plane
    ``i = n_used - 1 - j``: ``sum over its m z-cells of (density - 1) * dz`` [Mpc/h] (the
    density contrast integrated over the slab), ``[nx, ny]`` sharded ``P('x', 'y')``.  The
    slab is cut on the local z axis inside ``shard_map`` (z is not sharded): nothing is
    gathered.  ``step`` may be traced (the scan index); out-of-range steps are clamped.
    """
    _check_grid(geometry, grid)
    m, n_used = geometry.slab_cells, geometry.n_used
    dz = float(grid.cell[2])

    def local(rho, step):
        start = (n_used - 1 - step) * m
        slab = lax.dynamic_slice_in_dim(rho, start, m, axis=2)
        return jnp.sum(slab - 1.0, axis=2) * jnp.asarray(dz, rho.dtype)

    fn = jax.shard_map(local, mesh=grid.mesh, in_specs=(FIELD_SPEC, P()), out_specs=FIELD_SPEC)

    def hook(density, disp, a, step):
        del disp, a
        return fn(density.rho, jnp.asarray(step, jnp.int32))

    return hook


# ============================================================================ Born projection


def _interp_tables(geometry: LensGeometry, order: str, dtype):
    """Host tables for bilinear periodic interpolation of every plane at every pixel.

    Returns, for x and y, the lower grid index ``[n_used, npix]`` (int32), the upper one and
    the weight of the upper one (``dtype``), for planes in ``order``.
    """
    r = geometry.plane_r if order == "near_first" else geometry.plane_r[::-1]
    th = geometry.theta
    out = []
    for ax in (0, 1):
        L, n = geometry.box[ax], geometry.shape[ax]
        u = (0.5 * L + th[None, :] * r[:, None]) / (L / n)  # grid coordinate, [n_used, npix]
        u0 = np.floor(u)
        f = u - u0
        i0 = np.mod(u0.astype(np.int64), n)
        out += [i0.astype(np.int32), np.mod(i0 + 1, n).astype(np.int32), f.astype(dtype)]
    return out


def _check_planes(planes, geometry: LensGeometry, grid, order: str) -> None:
    if order not in ("steps", "near_first"):
        raise ValueError(f"order must be 'steps' or 'near_first', got {order!r}")
    _check_grid(geometry, grid)
    if planes.shape != (geometry.n_used, *geometry.shape[:2]):
        raise ValueError(f"planes must be [n_used, nx, ny] = {(geometry.n_used, *geometry.shape[:2])}, "
                         f"got {tuple(planes.shape)}")


def project_planes(planes, geometry: LensGeometry, grid, *, order: str = "steps"):
    """Each plane evaluated at the pixels: ``plane_i(theta r_i)`` ``[n_used, npix, npix]``
    sharded ``P(None, 'x', 'y')``, in the order of the input.

    ``planes`` is ``[n_used, nx, ny]`` (``P(None, 'x', 'y')``); ``order="steps"`` (default)
    means the PM step order, farthest plane first, ``"near_first"`` means plane 0 first.
    Pixel ``(jx, jy)`` of plane i reads the plane at grid coordinates
    ``((Lx/2 + theta_jx r_i)/cell_x, (Ly/2 + theta_jy r_i)/cell_y)`` (grid point ``(i, j)`` at
    ``(i cell_x, j cell_y)``), bilinearly with periodic wrap.  Inside ``shard_map`` each
    plane in turn is ``all_gather``-ed over both mesh axes (peak: one full plane per device)
    and each device computes its own block of pixels.  Linear in ``planes``.
    """
    _check_planes(planes, geometry, grid, order)
    return _project(planes, geometry, grid, order)


@partial(jax.jit, static_argnums=(1, 2, 3))
def _project(planes, geometry, grid, order):
    dt = planes.dtype
    x0, x1, fx, y0, y1, fy = (jnp.asarray(t) for t in _interp_tables(geometry, order, dt))
    xs, ys = P(None, "x"), P(None, "y")

    def local(pl, x0, x1, fx, y0, y1, fy):
        # pl [n, bx, by]; x* [n, bpx]; y* [n, bpy]
        def one(args):
            p, x0, x1, fx, y0, y1, fy = args
            full = lax.all_gather(p, "x", axis=0, tiled=True)
            full = lax.all_gather(full, "y", axis=1, tiled=True)  # [nx, ny]
            rows = (1.0 - fx)[:, None] * full[x0] + fx[:, None] * full[x1]  # [bpx, ny]
            return (1.0 - fy)[None, :] * rows[:, y0] + fy[None, :] * rows[:, y1]  # [bpx, bpy]

        return lax.map(one, (pl, x0, x1, fx, y0, y1, fy))

    fn = jax.shard_map(local, mesh=grid.mesh, in_specs=(KAPPA_SPEC, xs, xs, xs, ys, ys, ys),
                       out_specs=KAPPA_SPEC)
    return fn(planes, x0, x1, fx, y0, y1, fy)


def born_weights(cosmo: Cosmology, geometry: LensGeometry, nz_bins: Sequence[NzBin], *,
                 plane_a=None):
    """``[n_bins, n_used]`` Born weights q_b(r_i) = 1.5 Omega_m (H0/c)^2 (r_i / a_i) g_b(r_i)
    [h/Mpc], planes nearest first.  ``a_i`` from ``cosmo`` unless ``plane_a`` is given."""
    return _born_weights_jit(cosmo, geometry, as_bin_list(nz_bins), plane_a)


@partial(jax.jit, static_argnums=(1,))
def _born_weights_jit(cosmo, geometry, nz_bins, plane_a):
    dt = result_dtype(cosmo)
    r = jnp.asarray(geometry.plane_r, dt)
    a = a_of_chi(cosmo, r) if plane_a is None else jnp.asarray(plane_a, dt)
    g = lensing_efficiencies(cosmo, nz_bins, r)
    return 1.5 * jnp.asarray(cosmo.Omega_m, dt) / C_OVER_H0 ** 2 * (r / a) * g


def born_convergence(cosmo: Cosmology, planes, geometry: LensGeometry, grid,
                     nz_bins: Sequence[NzBin], *, order: str = "steps", plane_a=None):
    """Born convergence ``[n_bins, npix, npix]`` sharded ``P(None, 'x', 'y')``.

    kappa_b(theta) = 1.5 Omega_m (H0/c)^2 sum_i (r_i / a_i) g_b(r_i) plane_i(theta r_i).

    Args:
        planes: ``[n_used, nx, ny]`` ``P(None, 'x', 'y')``, delta integrated over each slab
            [Mpc/h] (the stacked :func:`plane_hook` outputs).  ``order="steps"`` (default):
            the PM step order, farthest plane first; ``"near_first"``: plane 0 first.
        plane_a: optional ``[n_used]`` (nearest first) scale factors for the 1/a_i weight;
            default: ``a(r_i)`` of ``cosmo`` (differentiable).  Pass ``geometry.plane_a`` to
            use the geometry's (fiducial) crossing times instead.
    Differentiable in ``planes`` and ``cosmo`` (Omega_m, a_i and chi(z) in g_b).
    """
    _check_planes(planes, geometry, grid, order)
    # two jitted pieces: the weights (cosmology, compiled once per geometry) and the
    # projection (compiled per device mesh); inside an outer jit both are simply inlined
    w = _born_weights_jit(cosmo, geometry, as_bin_list(nz_bins), plane_a)  # nearest first
    return _born_apply(planes, w, geometry, grid, order)


@partial(jax.jit, static_argnums=(2, 3, 4))
def _born_apply(planes, w, geometry, grid, order):
    proj = _project(planes, geometry, grid, order)  # [n_used, npix, npix]
    if order == "steps":
        w = w[:, ::-1]
    kappa = jnp.einsum("bi,ixy->bxy", w.astype(proj.dtype), proj)
    return jax.lax.with_sharding_constraint(kappa, NamedSharding(grid.mesh, KAPPA_SPEC))


