"""The light cone: where the lens planes lie in the PM box and when the particles cross them.

Geometry (flat sky, Born approximation)
---------------------------------------
The observer sits on the ``z = 0`` face of the periodic box, at the transverse position
``(Lx/2, Ly/2)``, and looks along ``+z``.  The line-of-sight axis (``nz`` cells, length ``Lz``)
is cut into ``n_planes`` slabs of equal width ``dr = Lz / n_planes`` (``m = nz / n_planes``
cells each).  Plane ``i`` (``i = 0`` nearest) has its centre at ``r_i = (i + 1/2) dr`` and is
crossed at ``a_i = a(chi = r_i)``.  Only the ``n_used`` planes with ``r_i - dr/2 < chi(z_max)``
(the farthest source of any bin) are used.

The distances ``r_i`` are fixed by the box, whatever the cosmology; the crossing times
``a_i`` depend on it.  :class:`LensGeometry` keeps host (numpy) values computed with the
cosmology it was built from (``plane_a``, used to place the PM steps) and
:meth:`LensGeometry.plane_a_of` gives them as a traced function of any cosmology.

:func:`lens_geometry` builds it from the config (host side, validates: slabs of whole cells,
a box deep enough for the farthest source, pixels divisible by the device mesh, a field of view
that fits in the box, unless replication is allowed: then a :class:`ReplicationWarning`).  The
lens planes and the Born projection that use it are in :mod:`fli.lensing.born`.

Units: lengths in Mpc/h, angles in radians inside the code (``fov_deg`` in degrees, pixel
areas in arcmin^2 or sr as named).
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from fli.cosmo.background import Cosmology, a_of_chi, comoving_distance
from fli.sim.host import cpu_float64
from fli.sim.sharding import get_logger, mesh_pdims
from fli.lensing.survey import nz_bins_from_config, result_dtype

_log = get_logger("fli.lensing.light_cone")


class ReplicationWarning(UserWarning):
    """The field of view is wider than the box at the farthest lens planes."""


def _host_cosmo(cosmo: Cosmology) -> Cosmology:
    return jax.tree_util.tree_map(lambda v: np.float64(v), cosmo)


_comoving_distance_jit = jax.jit(comoving_distance)
_a_of_chi_jit = jax.jit(a_of_chi)


def _host_chi_of_z(cosmo: Cosmology, z) -> np.ndarray:
    """chi(z) [Mpc/h] in float64 on the host (``cosmo`` concrete)."""
    with cpu_float64():
        return np.asarray(_comoving_distance_jit(_host_cosmo(cosmo), 1.0 / (1.0 + np.asarray(z, float))))


def _host_a_of_chi(cosmo: Cosmology, chi) -> np.ndarray:
    """a(chi) in float64 on the host (``cosmo`` concrete)."""
    with cpu_float64():
        return np.asarray(_a_of_chi_jit(_host_cosmo(cosmo), np.asarray(chi, float)))


@dataclasses.dataclass(frozen=True, eq=False)
class LensGeometry:
    """Static (hashable) description of the light cone; build with :func:`lens_geometry` or
    :meth:`LensGeometry.create`.

    Attributes:
        box: ``(Lx, Ly, Lz)`` [Mpc/h]; shape: mesh cells ``(nx, ny, nz)``.
        n_planes: slabs along z (``nz % n_planes == 0``); only ``n_used`` are used.
        fov_deg: side of the square map [deg]; npix: pixels per side; pdims: device mesh.
        plane_r: ``[n_used]`` plane centres ``(i + 1/2) dr`` [Mpc/h], nearest first.
        plane_a: ``[n_used]`` crossing scale factors (host, for the cosmology the geometry was
            built with; decreasing).  ``plane_a_of(cosmo)`` gives them traced.
        z_source_max, chi_source_max: farthest source redshift and its distance [Mpc/h].
        allow_replication: whether a field of view wider than the box was allowed.
    """

    box: tuple[float, float, float]
    shape: tuple[int, int, int]
    n_planes: int
    fov_deg: float
    npix: int
    pdims: tuple[int, int]
    plane_r: np.ndarray
    plane_a: np.ndarray
    z_source_max: float
    chi_source_max: float
    allow_replication: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "box", tuple(float(b) for b in self.box))
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        object.__setattr__(self, "pdims", tuple(int(p) for p in self.pdims))
        for name in ("plane_r", "plane_a"):
            arr = np.array(getattr(self, name), dtype=np.float64)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        if self.plane_r.shape != self.plane_a.shape or self.plane_r.ndim != 1:
            raise ValueError("plane_r and plane_a must be 1D arrays of the same length")

    # -- hashing: static under jit ------------------------------------------------------
    def _key(self):
        return (self.box, self.shape, self.n_planes, self.fov_deg, self.npix, self.pdims,
                tuple(self.plane_r.tolist()), tuple(self.plane_a.tolist()), self.z_source_max,
                self.chi_source_max, self.allow_replication)

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other) -> bool:
        return isinstance(other, LensGeometry) and self._key() == other._key()

    # -- construction -------------------------------------------------------------------
    @classmethod
    def create(cls, cosmo: Cosmology, box, shape, n_planes: int, fov_deg: float, npix: int,
               z_source_max: float, *, pdims=(1, 1), allow_replication: bool = False,
               chi_cover: float | None = None) -> "LensGeometry":
        """Validate plain values and build the geometry (host side; ``cosmo`` concrete).

        Raises one-line ``ValueError``s naming the config key: ``lensing.n_planes`` must divide
        ``simulation.mesh[2]``; ``simulation.box[2]`` must reach chi(z_max) of the sources;
        ``lensing.npix`` must divide by ``distributed.pdims``; ``lensing.fov_deg`` times the
        farthest plane distance must fit in ``min(Lx, Ly)`` unless ``allow_replication`` (then a
        :class:`ReplicationWarning` is issued and logged).

        ``chi_cover`` [Mpc/h], if larger than chi(z_max) of ``cosmo``, is the farthest source
        distance the light cone must reach instead: the largest over the cosmologies a prior
        allows (:func:`fli.forward.build_forward`), so that one set of planes serves them all.
        """
        box = tuple(float(b) for b in box)
        shape = tuple(int(n) for n in shape)
        n_planes, npix = int(n_planes), int(npix)
        px, py = (int(p) for p in pdims)
        if n_planes < 1 or shape[2] % n_planes:
            raise ValueError(f"lensing.n_planes = {n_planes} must divide simulation.mesh[2] = {shape[2]} "
                             f"(each plane is a slab of whole cells; valid: divisors of {shape[2]})")
        if not (0.0 < fov_deg < 180.0):
            raise ValueError(f"lensing.fov_deg must be in (0, 180) degrees, got {fov_deg}")
        if npix < 1 or npix % px or npix % py:
            raise ValueError(f"lensing.npix = {npix} must be divisible by distributed.pdims ({px}, {py}) "
                             f"on both axes (maps are sharded P('x', 'y'))")
        if not (math.isfinite(z_source_max) and z_source_max > 0):
            raise ValueError(f"survey.bins[].z_max (farthest source) must be > 0, got {z_source_max}")
        chi_max = float(_host_chi_of_z(cosmo, z_source_max))
        if chi_cover is not None:
            chi_max = max(chi_max, float(chi_cover))
        lz = box[2]
        if lz < chi_max:
            raise ValueError(
                f"simulation.box[2] = {lz:g} Mpc/h must be >= chi(z_max = {z_source_max:g}) = {chi_max:.1f} "
                f"Mpc/h, the distance to the farthest source (survey.bins[].z_max <= "
                f"{_z_of_chi_host(cosmo, lz):.3f} for this box)")
        dr = lz / n_planes
        r_all = (np.arange(n_planes) + 0.5) * dr
        n_used = int(np.sum(r_all - 0.5 * dr < chi_max))
        r = r_all[:n_used]
        a = _host_a_of_chi(cosmo, r)
        geom = cls(box, shape, n_planes, float(fov_deg), npix, (px, py), r, a, float(z_source_max),
                   chi_max, bool(allow_replication))
        if geom.replicated:
            width = geom.fov_rad * r[-1]
            msg = (f"lensing.fov_deg = {fov_deg:g} deg spans {width:.1f} Mpc/h at the farthest "
                   f"plane (r = {r[-1]:.1f} Mpc/h) > min(Lx, Ly) = {min(box[:2]):g} Mpc/h: the map would see "
                   f"the same structures twice; need fov_deg <= {math.degrees(min(box[:2]) / r[-1]):.3g} "
                   f"or lensing.allow_replication = true")
            if not allow_replication:
                raise ValueError(msg)
            note = geom.replication_note()
            warnings.warn(note, ReplicationWarning, stacklevel=2)
            _log.warning(note)
        return geom

    # -- derived quantities -------------------------------------------------------------
    @property
    def n_used(self) -> int:
        return int(self.plane_r.shape[0])

    @property
    def dr(self) -> float:
        """Slab width Lz / n_planes [Mpc/h]."""
        return self.box[2] / self.n_planes

    @property
    def slab_cells(self) -> int:
        """Cells per slab m = nz / n_planes."""
        return self.shape[2] // self.n_planes

    @property
    def cell(self) -> np.ndarray:
        return np.asarray(self.box) / np.asarray(self.shape)

    @property
    def fov_rad(self) -> float:
        return math.radians(self.fov_deg)

    @property
    def pixel_size_rad(self) -> float:
        return self.fov_rad / self.npix

    @property
    def pixel_size_arcmin(self) -> float:
        return self.fov_deg * 60.0 / self.npix

    @property
    def pixel_area_arcmin2(self) -> float:
        return self.pixel_size_arcmin ** 2

    @property
    def pixel_area_sr(self) -> float:
        return self.pixel_size_rad ** 2

    @property
    def theta(self) -> np.ndarray:
        """``[npix]`` pixel-centre angles (j + 1/2 - npix/2) fov/npix [rad], same along x and y."""
        return (np.arange(self.npix) + 0.5 - 0.5 * self.npix) * self.pixel_size_rad

    @property
    def r_replication(self) -> float:
        """Distance [Mpc/h] beyond which the field of view is wider than min(Lx, Ly)."""
        return min(self.box[:2]) / self.fov_rad

    @property
    def replicated(self) -> bool:
        """True if the farthest plane sees a width fov * r larger than min(Lx, Ly)."""
        return bool(self.fov_rad * self.plane_r[-1] > min(self.box[:2]) * (1 + 1e-12))

    def replication_note(self) -> str:
        """Which transverse scales the periodic wrap replicates (one line)."""
        lmin = min(self.box[:2])
        if not self.replicated:
            return (f"no replication: the field of view ({self.fov_deg:g} deg) fits in the box "
                    f"(min(Lx, Ly) = {lmin:g} Mpc/h) up to the farthest plane "
                    f"r = {self.plane_r[-1]:.1f} Mpc/h")
        n_rep = int(np.sum(self.plane_r > self.r_replication))
        return (f"beyond r = {self.r_replication:.1f} Mpc/h the field of view ({self.fov_deg:g} deg) exceeds "
                f"the box (min(Lx, Ly) = {lmin:g} Mpc/h): on the {n_rep} farthest of {self.n_used} planes "
                f"transverse modes > L are replicated, i.e. plane i repeats with angular period L / r_i "
                f"(down to {math.degrees(lmin / self.plane_r[-1]):.3g} deg, ell < "
                f"{2 * math.pi * self.plane_r[-1] / lmin:.0f} at the farthest plane)")

    # -- times --------------------------------------------------------------------------
    def plane_a_of(self, cosmo: Cosmology):
        """``[n_used]`` crossing scale factors a(r_i) for ``cosmo`` (traced, differentiable)."""
        dt = result_dtype(cosmo)
        return a_of_chi(cosmo, jnp.asarray(self.plane_r, dt))

    def a_steps(self, a_start, cosmo: Cosmology | None = None):
        """PM step boundaries ``[a_start, a_{n-1}, ..., a_0]`` (``n_used + 1``, increasing).

        Step ``j`` ends at the crossing of plane ``n_used - 1 - j`` (farthest first).  With
        ``cosmo=None`` host numpy from ``plane_a``; with a cosmology a traced jnp array.
        Raises ``ValueError`` if (concrete) ``a_start`` is not before the farthest plane.
        """
        if cosmo is None:
            a0 = float(a_start)
            if not (0.0 < a0 < self.plane_a[-1]):
                raise ValueError(f"simulation.a_start = {a0:g} must be in (0, {self.plane_a[-1]:.4g}), "
                                 f"before the crossing of the farthest lens plane "
                                 f"(r = {self.plane_r[-1]:.1f} Mpc/h)")
            return np.concatenate([[a0], self.plane_a[::-1]])
        a = self.plane_a_of(cosmo)
        if not isinstance(a_start, jax.core.Tracer) and not isinstance(a, jax.core.Tracer):
            if not float(a_start) < float(a[-1]):
                raise ValueError(f"simulation.a_start = {float(a_start):g} must be < {float(a[-1]):.4g}, the "
                                 f"crossing of the farthest lens plane (r = {self.plane_r[-1]:.1f} Mpc/h)")
        return jnp.concatenate([jnp.asarray(a_start, a.dtype)[None], a[::-1]])

    def plane_index(self, step):
        """Plane crossed at the end of PM step ``step``: ``n_used - 1 - step`` (int or traced)."""
        return self.n_used - 1 - step

    def step_of_plane(self, i):
        """PM step that ends at plane ``i`` (the inverse of :meth:`plane_index`)."""
        return self.n_used - 1 - i


def _z_of_chi_host(cosmo: Cosmology, chi: float) -> float:
    a = float(_host_a_of_chi(cosmo, chi))
    return 1.0 / a - 1.0 if a > 0 else float("inf")


def lens_geometry(cosmo: Cosmology, grid, lensing_cfg, survey_cfg) -> LensGeometry:
    """:meth:`LensGeometry.create` from a :class:`~fli.sim.grid.Grid`, ``LensingConfig`` and
    ``SurveyConfig`` (z_max = largest redshift with n(z) > 0 over all bins)."""
    bins = nz_bins_from_config(survey_cfg)
    z_max = max(b.z_max for b in bins)
    return LensGeometry.create(cosmo, grid.box, grid.shape, lensing_cfg.n_planes, lensing_cfg.fov_deg,
                               lensing_cfg.npix, z_max, pdims=mesh_pdims(grid.mesh),
                               allow_replication=lensing_cfg.allow_replication)


def _check_grid(geometry: LensGeometry, grid) -> None:
    if tuple(grid.shape) != geometry.shape or not np.allclose(grid.box, geometry.box):
        raise ValueError(f"the lens geometry was built for mesh {geometry.shape}, box {geometry.box}; "
                         f"the grid has mesh {tuple(grid.shape)}, box {tuple(grid.box)}")
    pd = mesh_pdims(grid.mesh)
    if geometry.npix % pd[0] or geometry.npix % pd[1]:
        raise ValueError(f"lensing.npix = {geometry.npix} must be divisible by distributed.pdims {pd} "
                         f"on both axes (maps are sharded P('x', 'y'))")
