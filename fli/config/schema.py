"""Configuration schemas: the one place where Hydra's composed config becomes typed values.

Each group of ``conf/`` has a dataclass here or, for the inference's groups, in
:mod:`fli.config.inference` (re-exported here), registered in Hydra's ConfigStore as the schema
of the whole tree, so that an unknown key or a wrong type fails at composition with its name.
``__post_init__`` checks ranges; :func:`to_config` turns a composed ``DictConfig`` into a
frozen :class:`Config` (below it, library code sees plain values, never a ``DictConfig``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from fli.config.checks import ConfigError, _check, _finite
from fli.config.inference import DiagnoseConfig, InferenceConfig, PriorConfig

COSMOLOGY_PARAMETERS = ("Omega_c", "Omega_b", "h", "n_s", "sigma8", "w0", "wa")


@dataclass
class CosmologyConfig:
    """Flat LambdaCDM (+ w0/wa) parameters; h is H0 / (100 km/s/Mpc). ``radiation``: photons
    at ``T_cmb`` [K] and ``N_eff`` massless neutrino species in the expansion history, as in
    CCL (false: a radiation-free background, fli's before radiation was added)."""

    Omega_c: float = 0.2607  # cold dark matter density today (Planck 2018)
    Omega_b: float = 0.0490  # baryon density today
    h: float = 0.6766  # H0 / (100 km/s/Mpc)
    n_s: float = 0.9665  # primordial spectral index
    sigma8: float = 0.8102  # rms linear density contrast in spheres of 8 Mpc/h today
    w0: float = -1.0  # dark energy's equation of state w(a) = w0 + wa (1 - a)
    wa: float = 0.0  # its evolution with a
    radiation: bool = True  # photons and massless neutrinos in the expansion history
    T_cmb: float = 2.7255  # [K] CMB temperature today
    N_eff: float = 3.044  # effective number of massless neutrino species

    def parameters(self) -> dict[str, float]:
        """The seven cosmological parameters (a mock's truth), without the radiation switches."""
        return {k: float(getattr(self, k)) for k in COSMOLOGY_PARAMETERS}

    def __post_init__(self) -> None:
        for k in (*COSMOLOGY_PARAMETERS, "T_cmb", "N_eff"):
            _check(_finite(getattr(self, k)), f"cosmology.{k}", "a finite number", getattr(self, k))
        _check(isinstance(self.radiation, bool), "cosmology.radiation", "true or false", self.radiation)
        _check(0 < self.T_cmb < 10, "cosmology.T_cmb", "in (0, 10) K", self.T_cmb)
        _check(0 <= self.N_eff < 10, "cosmology.N_eff", "in [0, 10)", self.N_eff)
        _check(0 < self.Omega_c < 1, "cosmology.Omega_c", "in (0, 1)", self.Omega_c)
        _check(0 <= self.Omega_b < 1, "cosmology.Omega_b", "in [0, 1)", self.Omega_b)
        _check(self.Omega_c + self.Omega_b < 1, "cosmology.Omega_c + Omega_b", "< 1", self.Omega_c + self.Omega_b)
        _check(0.2 < self.h < 2, "cosmology.h", "in (0.2, 2)", self.h)
        _check(0.5 < self.n_s < 1.5, "cosmology.n_s", "in (0.5, 1.5)", self.n_s)
        _check(0 < self.sigma8 < 3, "cosmology.sigma8", "in (0, 3)", self.sigma8)


@dataclass
class SimulationConfig:
    """Particle-mesh simulation: one particle per cell of ``mesh`` in a periodic ``box``."""

    mesh: list[int] = field(default_factory=lambda: [64, 64, 256])  # cells [nx, ny, nz]
    box: list[float] = field(default_factory=lambda: [300.0, 300.0, 3200.0])  # [Mpc/h]
    a_start: float = 0.1  # scale factor of the 2LPT initial conditions
    n_steps: int = 10  # PM steps when not aligned to lens planes (linear in a)
    lpt_order: int = 2  # 1: Zel'dovich, 2: 2LPT
    halo: int = 8  # [cells] padding for painting/reading; must exceed the largest displacement
    on_overflow: str = "raise"  # "raise" | "warn" when particles move further than the halo
    dtype: str = "float32"  # "float32" | "float64"
    fft_backend: str = "pencil"  # "pencil" | "jaxdecomp"
    adjoint: str = "reversible"  # "reversible" | "checkpoint"
    force_correction: float = 0.25  # c in the PM force's 1 + c sum (k_i h_i)^2; 0 = off
    assignment: str = "cic"  # "cic" | "tsc": the PM force's and the density's mass assignment
    forward: str = "pm"  # "pm" (2LPT + FastPM) | "linear" (lens planes cut from D(a) delta_L)

    def __post_init__(self) -> None:
        _check(len(self.mesh) == 3 and all(isinstance(n, int) and n >= 2 for n in self.mesh),
               "simulation.mesh", "three integers >= 2", list(self.mesh))
        _check(len(self.box) == 3 and _finite(*self.box) and all(b > 0 for b in self.box),
               "simulation.box", "three positive lengths [Mpc/h]", list(self.box))
        _check(_finite(self.a_start) and 0 < self.a_start < 1, "simulation.a_start", "in (0, 1)", self.a_start)
        _check(self.n_steps >= 1, "simulation.n_steps", ">= 1", self.n_steps)
        _check(self.lpt_order in (1, 2), "simulation.lpt_order", "1 or 2", self.lpt_order)
        _check(self.halo >= 1, "simulation.halo", ">= 1 cell", self.halo)
        _check(self.on_overflow in ("raise", "warn"), "simulation.on_overflow", "'raise' or 'warn'", self.on_overflow)
        _check(self.dtype in ("float32", "float64"), "simulation.dtype", "'float32' or 'float64'", self.dtype)
        _check(self.fft_backend in ("pencil", "jaxdecomp"), "simulation.fft_backend",
               "'pencil' or 'jaxdecomp'", self.fft_backend)
        _check(self.adjoint in ("checkpoint", "reversible"), "simulation.adjoint",
               "'checkpoint' or 'reversible'", self.adjoint)
        _check(_finite(self.force_correction) and self.force_correction >= 0, "simulation.force_correction",
               "a finite number >= 0 (0.25 corrects the one-particle-per-cell force; 0 turns it off)",
               self.force_correction)
        _check(self.assignment in ("cic", "tsc"), "simulation.assignment",
               "'cic' or 'tsc' (tsc: gradients continuous in the field, docs/muse_studies.md)", self.assignment)
        _check(self.forward in ("pm", "linear"), "simulation.forward", "'pm' or 'linear'", self.forward)


@dataclass
class LensingConfig:
    """Flat-sky light cone: observer at z = 0 of the box looking along +z."""

    fov_deg: float = 5.0  # [deg] side of the square map
    npix: int = 64  # map pixels per side
    n_planes: int = 16  # lens planes, slabs of equal comoving width
    allow_replication: bool = False  # allow fov wider than the box at the farthest plane
    lightcone: str = "traced"  # "traced": step and plane times follow the cosmology; "fiducial": frozen
    planes: str = "particles"  # "particles": painted onto the pixels; "mesh": slabs of the 3D density mesh
    # planes=particles: the potential-gradient-descent shift of the painted particles (fli/sim/pgd.py),
    # alpha(a) = pgd_alpha a^pgd_mu, filter exp(-(pgd_kl/k)^2 - (k/pgd_ks)^4) [h/Mpc]; pgd_alpha 0 is off.
    # Fitted on the low_s8 cosmology, seeds 200-207 (docs/fidelity.md)
    pgd_alpha: float = 1.0
    pgd_mu: float = 0.0  # PGD amplitude's power of a
    pgd_kl: float = 0.4  # [h/Mpc] PGD filter's large-scale cut
    pgd_ks: float = 1.0  # [h/Mpc] PGD filter's small-scale cut
    subparticles: int = 2  # planes=particles: each particle painted as n x n sub-particles (less shot noise)
    # the likelihood reads each bin's Fourier modes up to this multipole, whitened under the mask
    # (fli/infer/posterior/scale_cut.py); one per source bin; null: every pixel
    ell_max: Optional[list[float]] = None

    def __post_init__(self) -> None:
        _check(_finite(self.fov_deg) and 0 < self.fov_deg < 30, "lensing.fov_deg", "in (0, 30) degrees", self.fov_deg)
        _check(self.npix >= 2, "lensing.npix", ">= 2", self.npix)
        _check(self.n_planes >= 1, "lensing.n_planes", ">= 1", self.n_planes)
        _check(self.lightcone in ("traced", "fiducial"), "lensing.lightcone", "'traced' or 'fiducial'",
               self.lightcone)
        _check(self.planes in ("mesh", "particles"), "lensing.planes", "'mesh' or 'particles'", self.planes)
        _check(1 <= self.subparticles <= 4, "lensing.subparticles", "an integer in [1, 4]", self.subparticles)
        _check(_finite(self.pgd_alpha) and self.pgd_alpha >= 0, "lensing.pgd_alpha", ">= 0 (0 is off)", self.pgd_alpha)
        _check(_finite(self.pgd_mu), "lensing.pgd_mu", "a finite number", self.pgd_mu)
        _check(_finite(self.pgd_kl) and self.pgd_kl >= 0, "lensing.pgd_kl", ">= 0 h/Mpc", self.pgd_kl)
        _check(_finite(self.pgd_ks) and self.pgd_ks > 0, "lensing.pgd_ks", "> 0 h/Mpc", self.pgd_ks)
        _check(self.ell_max is None or (len(self.ell_max) > 0 and all(_finite(v) and v > 0 for v in self.ell_max)),
               "lensing.ell_max", "null (every pixel) or a list of positive multipoles, one per source bin",
               self.ell_max)


@dataclass
class NzBinConfig:
    """One tomographic source bin: Smail n(z) ~ z^alpha exp(-(z/z0)^beta) on [z_min, z_max],
    or a table (z, n(z)); ``n_gal`` galaxies per arcmin^2."""

    kind: str = "smail"  # "smail" | "table"
    z0: float = 0.5  # smail: scale redshift
    alpha: float = 2.0  # smail: power of z
    beta: float = 1.5  # smail: power of z / z0 in the exponential
    z_min: float = 0.0  # smail: n(z) cut below
    z_max: float = 3.0  # smail: n(z) cut above
    z: Optional[list[float]] = None  # table: redshifts, increasing
    nz: Optional[list[float]] = None  # table: n(z) at z (normalised by fli)
    n_gal: float = 10.0  # [arcmin^-2]

    def __post_init__(self) -> None:
        _check(self.kind in ("smail", "table"), "survey.bins[].kind", "'smail' or 'table'", self.kind)
        _check(_finite(self.n_gal) and self.n_gal > 0, "survey.bins[].n_gal", "> 0 per arcmin^2", self.n_gal)
        if self.kind == "smail":
            _check(0 <= self.z_min < self.z_max, "survey.bins[].z_min/z_max", "0 <= z_min < z_max",
                   (self.z_min, self.z_max))
            _check(self.z0 > 0 and self.beta > 0, "survey.bins[].z0/beta", "> 0", (self.z0, self.beta))
        else:
            _check(self.z is not None and self.nz is not None and len(self.z) == len(self.nz) >= 2,
                   "survey.bins[].z/nz", "two tables of the same length >= 2", (self.z, self.nz))


@dataclass
class SurveyConfig:
    sigma_e: float = 0.26  # shape noise per galaxy (per component)
    # tomographic bins, each its own map; a list of survey.bins[] entries
    bins: list[NzBinConfig] = field(default_factory=lambda: [
        NzBinConfig(z0=0.4, z_min=0.2, z_max=0.8, n_gal=10.0),
        NzBinConfig(z0=0.8, z_min=0.8, z_max=1.6, n_gal=10.0),
    ])
    mask: Optional[str] = None  # path to a .npy boolean [npix, npix] map (True = observed)

    def __post_init__(self) -> None:
        _check(_finite(self.sigma_e) and self.sigma_e >= 0, "survey.sigma_e", ">= 0", self.sigma_e)
        _check(len(self.bins) >= 1, "survey.bins", "a list of at least one bin", self.bins)


@dataclass
class DistributedConfig:
    pdims: list[int] = field(default_factory=lambda: [1, 1])  # 2D device mesh [px, py] the field is split over
    coordinator: Optional[str] = None  # "host:port"; None: auto-detect SLURM / Open MPI
    num_processes: Optional[int] = None  # with coordinator: processes in all
    process_id: Optional[int] = None  # with coordinator: this process's rank
    local_device_count: Optional[int] = None  # CPU devices per process (CPU runs only)

    def __post_init__(self) -> None:
        _check(len(self.pdims) == 2 and all(p >= 1 for p in self.pdims), "distributed.pdims",
               "two positive integers", list(self.pdims))
        if self.coordinator is not None:
            _check(self.num_processes is not None and self.process_id is not None,
                   "distributed.num_processes/process_id", "set when distributed.coordinator is set",
                   (self.num_processes, self.process_id))

# fli-diagnose's keys: they do not change a chain or a MAP, so a fli-nuts/fli-map resume may
# ignore them (a checkpoint written before they existed lacks them)
DIAGNOSE_KEYS = ("diagnose", "runs", "sweep")




@dataclass
class Config:
    """The whole configuration: the groups below and the run's own keys."""

    cosmology: CosmologyConfig = field(default_factory=CosmologyConfig)
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    lensing: LensingConfig = field(default_factory=LensingConfig)
    survey: SurveyConfig = field(default_factory=SurveyConfig)
    prior: PriorConfig = field(default_factory=PriorConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    diagnose: DiagnoseConfig = field(default_factory=DiagnoseConfig)
    seed: int = 0  # the mock's white noise, the samplers' keys
    run_dir: Optional[str] = None  # default: outputs/<command>/<timestamp>
    mock: Optional[str] = None  # the observation: a fli-observe directory or a fli-mock run (observation=<dir> sets it)
    runs: Optional[list[str]] = None  # fli-diagnose: fli-sample/fli-nuts run directories
    sweep: Optional[str] = None  # fli-diagnose: a fli-sample/fli-nuts multirun directory (each job subdirectory a run)
    init: Optional[str] = None  # sampling start: null/"prior", "truth", a point (.json/.npz), a fli-map run dir
    progress: bool = True  # progress lines with the time left on long stages
    compilation_cache: Optional[str] = "~/.cache/fli/jax"  # JAX's persistent compilation cache; null: off
    name: str = MISSING  # experiment name, set by the experiment file or config.yaml

    def __post_init__(self) -> None:
        sim, dist = self.simulation, self.distributed
        px, py = dist.pdims
        nx, ny, _ = sim.mesh
        if nx % px or ny % py:
            raise ConfigError(
                f"simulation.mesh {list(sim.mesh)} is not divisible by distributed.pdims {[px, py]}: "
                f"need mesh[0] % {px} == 0 and mesh[1] % {py} == 0"
            )
        bx, by = nx // px, ny // py
        _check(sim.halo <= min(bx, by), "simulation.halo",
               f"<= the local block {min(bx, by)} cells (mesh {list(sim.mesh)} over pdims {[px, py]})", sim.halo)


def register_configs() -> None:
    """Register :class:`Config` as the schema ``base_config`` of the config tree."""
    from hydra.core.config_store import ConfigStore  # noqa: PLC0415

    ConfigStore.instance().store(name="base_config", node=Config)


def to_config(cfg: DictConfig | dict) -> Config:
    """Validate a composed config and return it as :class:`Config` dataclasses.

    Raises :class:`ConfigError` with a one-line message naming the bad key.
    """
    from omegaconf.errors import OmegaConfBaseException  # noqa: PLC0415

    # a plain container: merged into the schema, a key the schema lacks is refused (a composed
    # DictConfig that carries the schema's type would let a Hydra "+key=value" through)
    cfg = OmegaConf.create(cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=False))
    try:
        schema = OmegaConf.structured(Config)
        merged = OmegaConf.merge(schema, cfg)
        obj = OmegaConf.to_object(merged)
    except ConfigError:
        raise
    except OmegaConfBaseException as e:  # unknown key, wrong type, missing value
        msg = str(e).splitlines()[0]
        key = getattr(e, "full_key", None)
        raise ConfigError(f"{key}: {msg}" if key else msg) from None
    except ValueError as e:
        raise ConfigError(str(e)) from None
    assert isinstance(obj, Config)
    return obj
