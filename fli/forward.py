"""The forward model of the observation: (cosmology, white noise) -> convergence maps.

:func:`build_forward` turns a validated config into a :class:`ForwardModel`; ``fli-mock`` runs it
at the truth and the NumPyro model (:mod:`fli.infer.posterior.model`) inside the likelihood, so the
mock and every inference command's prediction are one function. ``simulation.forward``:

* ``"pm"``: white noise -> linear field -> 2LPT -> FastPM steps ending at the lens-plane crossing
  times -> slabs of the density contrast -> Born convergence per source bin; the slabs summed
  from the mesh (``lensing.planes=mesh``) or painted from the particles (``lensing.planes=particles``,
  :mod:`fli.lensing.particle_planes`);
* ``"linear"``: the planes cut from the linear field ``D(a_i) delta_L``, no particles: kappa is
  linear in the white noise at fixed cosmology, so the field's posterior is Gaussian (the
  reference for recovery and for calibrating samplers).

``lensing.lightcone``: ``"traced"`` (default) fixes the plane distances r_i by the box and traces
the crossing times a_i = a(r_i; theta), so the PM step times, as differentiable functions of the
cosmology; ``"fiducial"`` freezes them at the config's cosmology, biased when the truth is elsewhere
(docs/map.md, "2. Fiducial vs traced light cone"). One set of planes serves the whole prior: the
geometry reaches the farthest chi(z_max) over the prior's corners (lowest Omega_m), where the box
depth, the replication rule and ``simulation.a_start`` are checked; a prior that breaks them is
refused, naming the bound and the value that would fit. Planes beyond a cosmology's own chi(z_max)
carry zero lensing weight.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.sharding import PartitionSpec as P

from fli.config import Config, ConfigError
from fli.cosmo.background import Cosmology, growth_factor
from fli.sim.grid import Grid
from fli.lensing.born import KAPPA_SPEC, born_convergence, plane_hook
from fli.lensing.light_cone import LensGeometry, _host_a_of_chi, _host_chi_of_z
from fli.sim.lpt import linear_field
from fli.sim.nbody import density, simulate
from fli.lensing.particle_planes import PLANES, check_particle_geometry, particle_plane_hook, pixel_born_convergence
from fli.sim.pgd import PGDParams
from fli.sim.sharding import FIELD_SPEC, make_mesh
from fli.lensing.survey import NzBin, nz_bins_from_config

PARAMS = ("Omega_c", "Omega_b", "h", "n_s", "sigma8", "w0", "wa")
FORWARDS = ("pm", "linear")
LIGHTCONES = ("traced", "fiducial")
# a normal prior has no bounds: its support for the light-cone checks is loc +- NORMAL_REACH scale
NORMAL_REACH = 5.0


class ForwardAux(NamedTuple):
    """What the forward model reports beside kappa.

    max_disp: ``[n_steps]`` largest transverse displacement in cells after each PM step (zeros
        for the linear forward); check it against ``grid.halo``.
    density: final particle count per cell ``[nx, ny, nz]`` ``P('x','y')`` (None unless asked).
    """

    max_disp: Array
    density: Array | None


@dataclasses.dataclass(frozen=True, eq=False)
class ForwardModel:
    """The static forward model; call it as ``fwd(cosmo, noise) -> (kappa, ForwardAux)``.

    Attributes:
        grid: the PM grid (shape, box, device mesh, halo, FFT).
        geometry: the light cone (planes up to the prior's farthest source).
        bins: the source n(z) bins.
        a_start: scale factor of the 2LPT initial conditions.
        lpt_order, adjoint: PM settings (see :func:`fli.sim.nbody.simulate`).
        kind: ``"pm"`` or ``"linear"``; lightcone: ``"traced"`` or ``"fiducial"``.
        planes: ``"mesh"`` (slabs of the density mesh, :func:`fli.lensing.born.plane_hook`) or
            ``"particles"`` (painted onto the pixels, :mod:`fli.lensing.particle_planes`); the PM
            forward's choice: the linear forward has no particles and cuts its planes from the
            linear field whatever this says;
            subparticles: each particle painted as that many squared (particle planes);
            pgd: the small-scale shift of the painted particles (:mod:`fli.sim.pgd`; None: off).
    """

    grid: Grid
    geometry: LensGeometry
    bins: tuple[NzBin, ...]
    a_start: float
    lpt_order: int = 2
    adjoint: str = "checkpoint"
    kind: str = "pm"
    lightcone: str = "traced"
    planes: str = "mesh"
    subparticles: int = 1
    pgd: PGDParams | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "bins", tuple(self.bins))
        if self.kind not in FORWARDS:
            raise ValueError(f"simulation.forward must be one of {FORWARDS}, got {self.kind!r}")
        if self.lightcone not in LIGHTCONES:
            raise ValueError(f"lensing.lightcone must be one of {LIGHTCONES}, got {self.lightcone!r}")
        if self.planes not in PLANES:
            raise ValueError(f"lensing.planes must be one of {PLANES}, got {self.planes!r}")
        if self.planes == "particles" and self.kind == "pm":
            check_particle_geometry(self.geometry)

    @property
    def n_bins(self) -> int:
        return len(self.bins)

    @property
    def kappa_shape(self) -> tuple[int, int, int]:
        """``(n_bins, npix, npix)``."""
        return (self.n_bins, self.geometry.npix, self.geometry.npix)

    def plane_a(self, cosmo: Cosmology) -> Array:
        """``[n_used]`` crossing scale factors, nearest plane first (traced or frozen)."""
        if self.lightcone == "fiducial":
            return jnp.asarray(self.geometry.plane_a, self.grid.jdtype)
        return self.geometry.plane_a_of(cosmo).astype(self.grid.jdtype)

    def a_steps(self, cosmo: Cosmology, plane_a: Array | None = None) -> Array:
        """``[n_used + 1]`` PM step boundaries: ``a_start``, then the plane crossings
        (``plane_a``, or :meth:`plane_a` of ``cosmo``), farthest first."""
        a = self.plane_a(cosmo) if plane_a is None else plane_a
        return jnp.concatenate([jnp.asarray([self.a_start], a.dtype), a[::-1]])

    def __call__(self, cosmo: Cosmology, noise: Array, *, return_density: bool = False
                 ) -> tuple[Array, ForwardAux]:
        """kappa ``[n_bins, npix, npix]`` sharded ``P(None, 'x', 'y')`` from ``noise``
        ``[nx, ny, nz]`` (unit white noise, ``P('x','y')``) at ``cosmo`` (traceable)."""
        dt = self.grid.jdtype
        cosmo = jax.tree.map(lambda v: jnp.asarray(v, dt), cosmo)
        if self.kind == "linear":
            a = self.plane_a(cosmo)
            planes = linear_planes(cosmo, noise, self.grid, self.geometry, a)
            kappa = born_convergence(cosmo, planes, self.geometry, self.grid, self.bins, order="near_first",
                                     plane_a=a)
            rho = None
            if return_density:
                rho = 1.0 + linear_field(cosmo, noise, self.grid, a[0])
            return kappa, ForwardAux(jnp.zeros((self.geometry.n_used,), dt), rho)
        a = self.plane_a(cosmo)  # once: the steps end at the crossings, and the Born weights read them
        if self.planes == "particles":
            hook = particle_plane_hook(self.geometry, self.grid, sub=self.subparticles, pgd=self.pgd)
        else:
            hook = plane_hook(self.geometry, self.grid)
        st, planes, maxd = simulate(cosmo, noise, self.grid, self.a_steps(cosmo, a), lpt_order=self.lpt_order,
                                    hook=hook, adjoint=self.adjoint)
        if self.planes == "particles":
            planes, reach = planes  # reach: z-displacements, held against the halo with the rest
            maxd = jnp.maximum(maxd, reach)
            kappa = pixel_born_convergence(cosmo, planes, self.geometry, self.grid, self.bins, plane_a=a)
        else:
            kappa = born_convergence(cosmo, planes, self.geometry, self.grid, self.bins, plane_a=a)
        rho = density(st.disp, self.grid) if return_density else None
        return kappa, ForwardAux(maxd, rho)


def linear_planes(cosmo: Cosmology, noise: Array, grid: Grid, geometry: LensGeometry, plane_a: Array) -> Array:
    """Lens planes of the linear field: ``D(a_i) sum_slab_i delta_L dz`` [Mpc/h],
    ``[n_used, nx, ny]`` sharded ``P(None, 'x', 'y')``, nearest plane first.

    ``delta_L`` is the linear density contrast at a = 1 (:func:`fli.sim.lpt.linear_field`); the
    slab sums run over the local z axis inside ``shard_map`` (nothing is gathered).
    """
    delta = linear_field(cosmo, noise, grid, 1.0)
    m, n_used = geometry.slab_cells, geometry.n_used
    nx_l, ny_l = grid.local_shape[:2]
    dz = float(grid.cell[2])

    def local(d):
        slabs = d[:, :, : n_used * m].reshape(nx_l, ny_l, n_used, m).sum(axis=3)
        return jnp.moveaxis(slabs, 2, 0) * jnp.asarray(dz, d.dtype)

    planes = jax.shard_map(local, mesh=grid.mesh, in_specs=FIELD_SPEC, out_specs=KAPPA_SPEC)(delta)
    d1 = growth_factor(cosmo, plane_a)
    return planes * d1.astype(planes.dtype)[:, None, None]


# ============================================================================ prior support


def prior_bounds(cfg: Config) -> dict[str, tuple[float, float]]:
    """Support of each sampled parameter for the light-cone checks: ``name -> (lo, hi)``.

    Uniform and truncated-normal priors: ``[low, high]``; normal priors:
    ``loc +- NORMAL_REACH * scale`` (probability 6e-7 outside)."""
    out = {}
    for name in cfg.prior.sample:
        p = cfg.prior.params[name]
        if p.dist == "normal":
            out[name] = (p.loc - NORMAL_REACH * p.scale, p.loc + NORMAL_REACH * p.scale)
        else:
            out[name] = (p.low, p.high)
    return out


def _corner_cosmologies(base: Cosmology, bounds: dict[str, tuple[float, float]]):
    names = list(bounds)
    for vals in itertools.product(*(bounds[n] for n in names)):
        yield dict(zip(names, vals, strict=True)), base.replace(**dict(zip(names, vals, strict=True)))


def _fmt(corner: dict) -> str:
    return ", ".join(f"{k} = {v:g}" for k, v in corner.items())


def _prior_key(name: str, side: int, cfg: Config) -> str:
    p = cfg.prior.params[name]
    if p.dist == "normal":
        return f"prior.params.{name}.loc/scale"
    return f"prior.params.{name}.{'low' if side == 0 else 'high'}"


def _fitting_bound(ok, name: str, bad: float, good: float) -> float:
    """Bisect the bound of ``name`` between a failing and a passing value (host)."""
    for _ in range(40):
        mid = 0.5 * (bad + good)
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def check_prior_lightcone(cfg: Config, fid: Cosmology, grid: Grid, z_max: float) -> float:
    """Check the light cone at every corner of the prior's support; return the farthest
    source distance chi(z_max) [Mpc/h] over the corners and the fiducial.

    Refuses (:class:`ConfigError`) a corner that is no valid cosmology, whose sources lie
    beyond the box depth, whose farthest plane is wider than the box (without
    ``lensing.allow_replication``), or whose farthest plane is crossed before
    ``simulation.a_start``: the message names the prior bound and the value that would fit.
    """
    bounds = prior_bounds(cfg)
    lz, lmin = grid.box[2], min(grid.box[:2])
    lcfg = cfg.lensing
    dr = lz / lcfg.n_planes
    fov = math.radians(lcfg.fov_deg)

    def chi_src(c):
        return float(_host_chi_of_z(c, z_max))

    def far_plane(chi):  # centre of the farthest plane needed to reach chi
        n = int(np.sum((np.arange(lcfg.n_planes) + 0.5) * dr - 0.5 * dr < chi))
        return (n - 0.5) * dr

    def problems(c):
        try:
            c.validate()
        except ValueError as e:
            return f"is not a valid cosmology ({e})"
        chi = chi_src(c)
        if chi > lz:
            return (f"puts the farthest sources (z = {z_max:g}) at chi = {chi:.1f} Mpc/h, beyond "
                    f"simulation.box[2] = {lz:g} Mpc/h")
        r = far_plane(chi)
        if fov * r > lmin * (1 + 1e-12) and not lcfg.allow_replication:
            return (f"needs lens planes to r = {r:.1f} Mpc/h, where lensing.fov_deg = {lcfg.fov_deg:g} spans "
                    f"{fov * r:.1f} Mpc/h > min(Lx, Ly) = {lmin:g} Mpc/h (lensing.allow_replication is false)")
        a_far = float(_host_a_of_chi(c, r))
        if not cfg.simulation.a_start < a_far:
            return (f"crosses the farthest plane (r = {r:.1f} Mpc/h) at a = {a_far:.4f}, before "
                    f"simulation.a_start = {cfg.simulation.a_start:g}")
        return None

    chi_max = chi_src(fid)
    for corner, c in _corner_cosmologies(fid, bounds):
        why = problems(c)
        if why is None:
            chi_max = max(chi_max, chi_src(c))
            continue
        # which bound to move: the first one whose move to the fiducial value mends this corner
        hints = []
        for name, v in corner.items():
            f = float(getattr(fid, name))
            if v == f:
                continue
            side = 0 if v == bounds[name][0] else 1
            if problems(c.replace(**{name: f})) is None:
                fit = _fitting_bound(lambda x, n=name: problems(c.replace(**{n: x})) is None, name, v, f)
                hints.append(f"{_prior_key(name, side, cfg)} = {fit:.4g} would fit")
        hint = "; ".join(hints) if hints else "narrow the prior or deepen/widen simulation.box"
        raise ConfigError(f"the prior corner ({_fmt(corner)}) {why}: {hint}")
    return chi_max


# ============================================================================ builder


def fiducial_cosmology(cfg: Config) -> Cosmology:
    """The config's ``cosmology`` as a :class:`Cosmology` (host floats), validated."""
    try:
        return Cosmology(**dataclasses.asdict(cfg.cosmology)).validate()
    except ValueError as e:
        raise ConfigError(f"cosmology.{e}") from None


def build_forward(cfg: Config, bins: list[NzBin] | None = None, mesh=None) -> ForwardModel:
    """The forward model of a validated config (host side; nothing is compiled here).

    Args:
        cfg: the validated config: ``simulation`` (grid, PM, ``forward``), ``lensing``
            (light cone, ``lightcone``), ``survey`` (bins, unless ``bins`` is given), ``prior``
            (the light cone must hold at every corner of its support) and ``distributed.pdims``.
        bins: source n(z) bins to use instead of ``survey.bins`` (an observation's tables).
        mesh: the device mesh (default: built from ``distributed.pdims``).
    Raises:
        ConfigError naming the key, for any inconsistency (see :func:`check_prior_lightcone`).
    """
    sim = cfg.simulation
    fid = fiducial_cosmology(cfg)
    mesh = make_mesh(cfg.distributed.pdims) if mesh is None else mesh
    grid = Grid(tuple(sim.mesh), tuple(sim.box), mesh, halo=sim.halo, fft_backend=sim.fft_backend,
                dtype=sim.dtype, force_correction=sim.force_correction, assignment=sim.assignment)
    try:
        bins = nz_bins_from_config(cfg.survey) if bins is None else list(bins)
        z_max = max(b.z_max for b in bins)
        chi_cover = check_prior_lightcone(cfg, fid, grid, z_max)
        geom = LensGeometry.create(fid, grid.box, grid.shape, cfg.lensing.n_planes, cfg.lensing.fov_deg,
                                   cfg.lensing.npix, z_max, pdims=grid.pdims,
                                   allow_replication=cfg.lensing.allow_replication, chi_cover=chi_cover)
        geom.a_steps(sim.a_start)  # validates a_start against the fiducial crossings
        return ForwardModel(grid, geom, tuple(bins), float(sim.a_start), sim.lpt_order, sim.adjoint,
                            sim.forward, cfg.lensing.lightcone, cfg.lensing.planes,
                            cfg.lensing.subparticles, _pgd_params(cfg))
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _pgd_params(cfg: Config) -> PGDParams | None:
    """The small-scale shift of the painted particles (particle planes only; None when off)."""
    lc = cfg.lensing
    if lc.planes != "particles" or lc.pgd_alpha == 0:
        return None
    return PGDParams(float(lc.pgd_alpha), float(lc.pgd_mu), float(lc.pgd_kl), float(lc.pgd_ks))


def map_sharding(fwd: ForwardModel):
    """Sharding of kappa maps ``[n_bins, npix, npix]``: ``P(None, 'x', 'y')``."""
    return jax.sharding.NamedSharding(fwd.grid.mesh, P(None, "x", "y"))
