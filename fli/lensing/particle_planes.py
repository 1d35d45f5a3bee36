"""Lens planes painted from the particles at the map's angular resolution (``lensing.planes=particles``).

The mesh planes of :func:`fli.lensing.born.plane_hook` sum the density mesh over a slab and are read
at the pixels; a cell spans several default pixels, so the map loses its small-scale power
(docs/fidelity.md, "Default configuration"). Here each PM step projects the particles of its slab
onto the pixels of its plane: plane ``i`` (centre ``r_i``, slab ``[i dr, (i + 1) dr)``) at the end
of the step that reaches its crossing time. With the observer at ``(Lx/2, Ly/2, 0)``, a particle is
seen at ``theta = ((x, y) - (Lx, Ly)/2) / r_i`` (flat sky, as the Born weights assume) and deposited
by the grid's scheme (:mod:`fli.sim.assignment`: 2D CIC, or TSC's 3 x 3) with mass ``V`` (a cell's
volume) times the fraction ``w_z`` of its z profile (a cell wide; TSC's three) inside the slab, so
it moves continuously between slabs and mass is conserved. A plane is the density contrast
integrated over the slab [Mpc/h], as a mesh plane is::

    plane_i(pixel) = sum_p w_z(p) V W(theta_p -> pixel) / (pixel side * r_i)^2  -  dr

Mass outside the field of view is dropped; a field of view wider than the box is refused. Poisson
particles give a plane a shot noise of angular power ``V dr / r_i^2`` (:func:`shot_noise_cl`).
Particles stay on their device (``P('x', 'y')``); each paints a full plane, and one ``psum_scatter``
per mesh axis sums them into a plane sharded ``P('x', 'y')``. Only particles within :func:`slab_pad`
Lagrangian z-cells of the slab are examined; the hook reports their largest |z-displacement| so that
:func:`fli.sim.painting.check_halo` guards that cut too. Derivatives are those of the weights:
continuous for TSC; for CIC they jump at pixel centres and at slab edges +- half a cell.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fli.sim.assignment import tsc_weights
from fli.cosmo.background import Cosmology
from fli.sim.halo import pad_local
from fli.lensing.born import KAPPA_SPEC, _born_weights_jit
from fli.lensing.light_cone import LensGeometry, _check_grid
from fli.sim.pgd import PGDParams, pgd_shift
from fli.sim.sharding import FIELD_SPEC, mesh_pdims
from fli.lensing.survey import NzBin, as_bin_list

PLANES = ("mesh", "particles")


def slab_pad(geometry: LensGeometry, halo: int, scheme: str = "cic") -> int:
    """Lagrangian z-cells examined beyond each side of a slab: enough for a particle displaced
    along z as far as the halo lets one move across (``halo * max(dx, dy)``), plus its extent
    (half a cell for CIC, one and a half for TSC)."""
    cell = geometry.cell
    return int(math.ceil(halo * max(cell[0], cell[1]) / cell[2])) + (1 if scheme == "cic" else 2)


def _tsc_cdf(x):
    """The integral of TSC's kernel (the quadratic B-spline on [-3/2, 3/2], unit area) up to ``x``:
    piecewise cubic with two continuous derivatives."""
    lo = (1.5 + x) ** 3 / 6.0
    mid = 1.0 / 6.0 + 0.75 * (x + 0.5) - (x**3 + 0.125) / 3.0
    hi = 1.0 - (1.5 - x) ** 3 / 6.0
    return jnp.where(x <= -1.5, 0.0, jnp.where(x < -0.5, lo, jnp.where(x < 0.5, mid, jnp.where(x < 1.5, hi, 1.0))))


def _transverse(u, scheme: str):
    """Pixel offsets and weights along one axis of the pixel coordinate ``u`` (pixel j's centre at
    u = j): CIC ``((0, 1 - f), (1, f))`` from ``floor(u)``; TSC's three from the nearest pixel."""
    if scheme == "cic":
        j = jnp.floor(u)
        f = u - j
        return j.astype(jnp.int32), ((0, 1.0 - f), (1, f))
    j = jnp.floor(u + 0.5)
    f = u - j
    return j.astype(jnp.int32), tuple(zip((-1, 0, 1), tsc_weights(f), strict=True))


def check_particle_geometry(geometry: LensGeometry) -> None:
    """Refuse a light cone the particle planes cannot paint (one line naming the key)."""
    if geometry.replicated:
        raise ValueError("lensing.planes = particles needs the field of view inside the box at the "
                         "farthest plane (it paints each particle once); use lensing.planes = mesh "
                         "with lensing.allow_replication = true, or a smaller lensing.fov_deg")


def paint_plane(pos, mass, i, geometry: LensGeometry, scheme: str = "cic"):
    """Particles onto plane ``i``'s pixels: ``[npix, npix]`` of ``sum_p mass_p w_z(p) V
    W(theta_p -> pixel) / (pixel side r_i)^2`` [Mpc/h] (the module docstring's formula
    without its ``- dr``; ``W`` the ``scheme``'s weights, CIC or TSC).

    ``pos`` ``[..., 3]`` comoving positions [Mpc/h] in the periodic box (wrapped here; the
    observer at ``(Lx/2, Ly/2, 0)``, looking along +z), ``mass`` ``[...]`` in particles (1 for
    one particle of a cell's volume ``V``), ``i`` the plane (an int or traced). Pure and local:
    :func:`particle_plane_hook` calls it on each device's particles and sums the planes.
    """
    dt = pos.dtype
    lx, ly, lz = geometry.box
    cz = float(geometry.cell[2])
    npix, dr, pix = geometry.npix, geometry.dr, geometry.pixel_size_rad
    volume = float(np.prod(geometry.cell))
    i = jnp.asarray(i, jnp.int32)
    r = jnp.asarray(np.asarray(geometry.plane_r, np.float64), dt)[i]
    # the particle's cell-wide extent along z against the slab [b0, b0 + dr), relative to b0
    zr = jnp.mod(pos[..., 2] - i.astype(dt) * dr + 0.5 * lz, lz) - 0.5 * lz
    if scheme == "cic":
        h = 0.5 * cz
        wz = jnp.clip(jnp.minimum(zr + h, dr) - jnp.maximum(zr - h, 0.0), 0.0, None) / (2 * h)
    else:
        wz = _tsc_cdf((dr - zr) / cz) - _tsc_cdf(-zr / cz)
    amp = mass * wz * (volume / (pix * r) ** 2)
    # angle theta = (x - L/2) / r_i -> pixel coordinate u (pixel j's centre at u = j)
    ux = (jnp.mod(pos[..., 0], lx) - 0.5 * lx) / (r * pix) + 0.5 * npix - 0.5
    uy = (jnp.mod(pos[..., 1], ly) - 0.5 * ly) / (r * pix) + 0.5 * npix - 0.5
    (jx, wxs), (jy, wys) = _transverse(ux, scheme), _transverse(uy, scheme)
    plane = jnp.zeros((npix * npix,), dt)
    for ox, wx in wxs:
        for oy, wy in wys:
            px_, py_ = jx + ox, jy + oy
            inside = (px_ >= 0) & (px_ < npix) & (py_ >= 0) & (py_ < npix)
            flat = jnp.where(inside, px_ * npix + py_, 0)
            plane = plane.at[flat.ravel()].add(jnp.where(inside, amp * wx * wy, 0.0).ravel())
    return plane.reshape(npix, npix)


def _sub_offsets(sub: int) -> list[float]:
    """Lagrangian offsets [cells] of ``sub`` sub-particles along an axis, centred in the cell."""
    return [(a + 0.5) / sub - 0.5 for a in range(sub)]


def _interp_axis(dp, o: float, axis: int, b: int):
    """``dp`` padded by one cell on ``axis``: its values at offset ``o`` in (-1/2, 1/2) cells
    from each of the ``b`` interior cells, linearly between the two nearest."""
    lo = math.floor(o)
    f = o - lo
    a = lax.slice_in_dim(dp, 1 + lo, 1 + lo + b, axis=axis)
    if f == 0.0:
        return a
    c = lax.slice_in_dim(dp, 2 + lo, 2 + lo + b, axis=axis)
    return (1.0 - f) * a + f * c


def particle_plane_hook(geometry: LensGeometry, grid, *, halves: bool = False, sub: int = 1,
                        pgd: PGDParams | None = None):
    """Per-step PM hook ``hook(density, disp, a, step) -> (plane, reach)``.

    ``disp`` ``[nx, ny, nz, 3]`` [Mpc/h] sharded ``P('x', 'y')``; for step ``j`` the hook paints
    plane ``i = n_used - 1 - j`` (see the module docstring): ``plane`` ``[npix, npix]`` sharded
    ``P('x', 'y')`` [Mpc/h]; ``reach`` the largest |z-displacement| of any particle, in
    transverse cells (to hold against the halo). ``step`` may be traced.

    ``halves=True`` (to measure the shot noise): ``plane`` is ``[3, npix, npix]``
    ``P(None, 'x', 'y')``, the plane of all particles, then those of the two halves of a 3D
    checkerboard of Lagrangian cells, each with twice the mass: half the difference of the
    halves has the full plane's discreteness noise and none of its signal.

    ``sub > 1`` (``lensing.subparticles``): each particle is painted as ``sub x sub``
    sub-particles of ``1 / sub^2`` of its mass, at Lagrangian offsets ``((a + 1/2)/sub - 1/2)``
    cells in x and y, displaced by the displacement field interpolated bilinearly between
    neighbouring particles (one row of the slab's particles is exchanged with each
    neighbouring device). Where the flow is single-stream this is what a finer particle
    lattice moved by the same forces would paint; the angular shot noise falls about as
    ``1 / sub^2``, for ``sub^2`` times the (cheap) painting.

    ``pgd`` (``alpha != 0``): the particles are shifted by :func:`fli.sim.pgd.pgd_shift` before they
    are painted (the dynamics are untouched), from ``density`` (the PM force's
    :class:`fli.sim.nbody.Density`: its FFT and the particles' stencil are not computed again);
    without it ``density`` is not read.
    """
    _check_grid(geometry, grid)
    check_particle_geometry(geometry)
    nx, ny, nz = geometry.shape
    px, py = mesh_pdims(grid.mesh)
    bx, by = nx // px, ny // py
    cx, cy, cz = (float(c) for c in geometry.cell)
    n_used, m = geometry.n_used, geometry.slab_cells
    dr = geometry.dr
    pad = min(slab_pad(geometry, grid.halo, grid.assignment), (nz - m) // 2)
    width = m + 2 * pad  # Lagrangian z-cells examined per slab

    def local(disp, step):
        dt = disp.dtype
        i = n_used - 1 - step  # plane painted at this step
        kz = jnp.mod(i * m - pad + jnp.arange(width), nz)  # Lagrangian z-cells examined (wrapping)
        d = jnp.take(disp, kz, axis=2)  # [bx, by, width, 3]
        ix = lax.axis_index("x") * bx + jnp.arange(bx)
        iy = lax.axis_index("y") * by + jnp.arange(by)
        masses = [jnp.full(d.shape[:-1], 1.0 / sub ** 2, dt)]
        if halves:
            even = (ix[:, None, None] + iy[None, :, None] + kz[None, None, :]) % 2 == 0
            masses += [jnp.where(even, 2.0 * masses[0], 0.0), jnp.where(even, 0.0, 2.0 * masses[0])]
        dp = pad_local(d, 1, (px, py)) if sub > 1 else None  # neighbours' displacements, one row
        planes = [jnp.zeros((geometry.npix, geometry.npix), dt) for _ in masses]
        for ox in _sub_offsets(sub):
            dx_ = _interp_axis(dp, ox, 0, bx) if sub > 1 else d
            for oy in _sub_offsets(sub):
                dxy = _interp_axis(dx_, oy, 1, by) if sub > 1 else d
                pos = jnp.stack(jnp.broadcast_arrays((ix.astype(dt) + ox)[:, None, None] * cx,
                                                     (iy.astype(dt) + oy)[None, :, None] * cy,
                                                     kz.astype(dt)[None, None, :] * cz), axis=-1) + dxy
                planes = [pl + paint_plane(pos, mass, i, geometry, grid.assignment)
                          for pl, mass in zip(planes, masses, strict=True)]
        plane = jnp.stack(planes) if halves else planes[0]
        ax = plane.ndim - 2
        plane = lax.psum_scatter(plane, "x", scatter_dimension=ax, tiled=True)
        plane = lax.psum_scatter(plane, "y", scatter_dimension=ax + 1, tiled=True)
        reach = lax.stop_gradient(jnp.max(jnp.abs(disp[..., 2])) / min(cx, cy))
        reach = lax.pmax(reach, ("x", "y"))
        return plane - jnp.asarray(dr, dt), reach

    spec = KAPPA_SPEC if halves else FIELD_SPEC
    fn = jax.shard_map(local, mesh=grid.mesh, in_specs=(FIELD_SPEC, P()), out_specs=(spec, P()))

    def hook(density, disp, a, step):
        if pgd is not None and pgd.alpha != 0:  # the PM force's density FFT and stencil, reused
            disp = disp + pgd_shift(density.rho_k, disp, a, grid, pgd, stencil=density.stencil)
        return fn(disp, jnp.asarray(step, jnp.int32))

    return hook


def pixel_born_convergence(cosmo: Cosmology, planes, geometry: LensGeometry, grid,
                           nz_bins: Sequence[NzBin], *, plane_a=None):
    """Born convergence ``[n_bins, npix, npix]`` ``P(None, 'x', 'y')`` from planes already on
    the pixels, ``[n_used, npix, npix]`` in PM step order (farthest first), as
    :func:`particle_plane_hook` stacks them: kappa_b = sum_i q_b(r_i) plane_i, with the weights
    of :func:`fli.lensing.born.born_weights` (``a_i`` from ``cosmo`` unless ``plane_a`` is given)."""
    want = (geometry.n_used, geometry.npix, geometry.npix)
    if tuple(planes.shape) != want:
        raise ValueError(f"pixel planes must be [n_used, npix, npix] = {want}, got {tuple(planes.shape)}")
    w = _born_weights_jit(cosmo, geometry, as_bin_list(nz_bins), plane_a)  # nearest first
    kappa = jnp.einsum("bi,ixy->bxy", w[:, ::-1].astype(planes.dtype), planes)
    return lax.with_sharding_constraint(kappa, NamedSharding(grid.mesh, KAPPA_SPEC))


def shot_noise_cl(geometry: LensGeometry, weights) -> np.ndarray:
    """Poisson shot noise of the Born convergence painted from particles, ``[n_bins]``.

    One particle per cell of volume ``V`` is a mean density ``1 / V``; plane ``i`` as a sum of
    points of angular density ``r_i^2 dr / V`` per steradian, each of amplitude ``V / r_i^2``,
    has white power ``V dr / r_i^2``, so ``N_b = sum_i q_b(r_i)^2 V dr / r_i^2`` (before the
    2D CIC window). ``weights`` ``[n_bins, n_used]`` nearest first
    (:func:`fli.lensing.born.born_weights`). A lattice start is sub-Poisson on large scales: measure
    the noise on the map too (scripts/studies/plane_fidelity.py halves the particles)."""
    w = np.asarray(weights, np.float64)
    cell = geometry.cell
    volume = float(cell[0] * cell[1] * cell[2])
    r = np.asarray(geometry.plane_r, np.float64)
    return (w ** 2 * volume * geometry.dr / r ** 2).sum(axis=1)
