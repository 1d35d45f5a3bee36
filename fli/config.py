"""Configuration schemas: the one place where Hydra's composed config becomes typed values.

Each group of ``conf/`` has a dataclass here, registered in Hydra's ConfigStore as the schema
of the whole tree, so that an unknown key or a wrong type fails at composition with its name.
``__post_init__`` checks ranges; :func:`to_config` turns a composed ``DictConfig`` into a
frozen :class:`Config` (below it, library code sees plain values, never a ``DictConfig``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf


class ConfigError(ValueError):
    """A configuration value is out of its valid range; the message names the key."""


def _check(cond: bool, key: str, valid: str, value: Any) -> None:
    if not cond:
        raise ConfigError(f"{key} must be {valid}, got {value!r}")


def _finite(*vals: float) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in vals)


COSMOLOGY_PARAMETERS = ("Omega_c", "Omega_b", "h", "n_s", "sigma8", "w0", "wa")


@dataclass
class CosmologyConfig:
    """Flat LambdaCDM (+ w0/wa) parameters; h is H0 / (100 km/s/Mpc). ``radiation``: photons
    at ``T_cmb`` [K] and ``N_eff`` massless neutrino species in the expansion history, as in
    CCL (false: a radiation-free background, fli's before radiation was added)."""

    Omega_c: float = 0.2607
    Omega_b: float = 0.0490
    h: float = 0.6766
    n_s: float = 0.9665
    sigma8: float = 0.8102
    w0: float = -1.0
    wa: float = 0.0
    radiation: bool = True
    T_cmb: float = 2.7255
    N_eff: float = 3.044

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
               "'cic' or 'tsc' (tsc: gradients continuous in the field, docs/muse.md)", self.assignment)
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
    # planes=particles: the potential-gradient-descent shift of the painted particles (fli/pgd.py),
    # alpha(a) = pgd_alpha a^pgd_mu, filter exp(-(pgd_kl/k)^2 - (k/pgd_ks)^4) [h/Mpc]; pgd_alpha 0 is off.
    # Fitted on the low_s8 cosmology, seeds 200-207 (docs/fidelity.md)
    pgd_alpha: float = 1.0
    pgd_mu: float = 0.0
    pgd_kl: float = 0.4
    pgd_ks: float = 1.0
    subparticles: int = 2  # planes=particles: each particle painted as n x n sub-particles (less shot noise)
    # the likelihood reads each bin's Fourier modes up to this multipole, whitened under the mask
    # (fli/infer/scale_cut.py); one per source bin; null: every pixel
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
    z0: float = 0.5
    alpha: float = 2.0
    beta: float = 1.5
    z_min: float = 0.0
    z_max: float = 3.0
    z: Optional[list[float]] = None
    nz: Optional[list[float]] = None
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
    bins: list[NzBinConfig] = field(default_factory=lambda: [
        NzBinConfig(z0=0.4, z_min=0.2, z_max=0.8, n_gal=10.0),
        NzBinConfig(z0=0.8, z_min=0.8, z_max=1.6, n_gal=10.0),
    ])
    mask: Optional[str] = None  # path to a .npy boolean [npix, npix] map (True = observed)

    def __post_init__(self) -> None:
        _check(_finite(self.sigma_e) and self.sigma_e >= 0, "survey.sigma_e", ">= 0", self.sigma_e)
        _check(len(self.bins) >= 1, "survey.bins", "a list of at least one bin", self.bins)


@dataclass
class ParamPrior:
    """Prior of one cosmological parameter. ``uniform`` on [low, high]; ``normal`` (loc, scale);
    ``truncated_normal`` (loc, scale) cut to [low, high]."""

    dist: str = "uniform"  # "uniform" | "normal" | "truncated_normal"
    low: float = 0.0
    high: float = 1.0
    loc: float = 0.0
    scale: float = 1.0

    def check(self, name: str) -> None:
        key = f"prior.params.{name}"
        _check(self.dist in ("uniform", "normal", "truncated_normal"), f"{key}.dist",
               "'uniform', 'normal' or 'truncated_normal'", self.dist)
        _check(_finite(self.low, self.high, self.loc, self.scale), key, "finite low, high, loc, scale",
               (self.low, self.high, self.loc, self.scale))
        if self.dist != "normal":
            _check(self.low < self.high, f"{key}.low/high", "low < high", (self.low, self.high))
        if self.dist != "uniform":
            _check(self.scale > 0, f"{key}.scale", "> 0", self.scale)


PARAM_NAMES = ("Omega_c", "Omega_b", "h", "n_s", "sigma8", "w0", "wa")


@dataclass
class PriorConfig:
    """Sampled cosmological parameters and their priors; the others stay at ``cosmology``."""

    sample: list[str] = field(default_factory=lambda: ["Omega_c", "sigma8"])
    params: dict[str, ParamPrior] = field(default_factory=lambda: {
        "Omega_c": ParamPrior(low=0.15, high=0.45),
        "sigma8": ParamPrior(low=0.5, high=1.1),
    })

    def __post_init__(self) -> None:
        _check(len(set(self.sample)) == len(self.sample), "prior.sample", "names without repeats", self.sample)
        for p in self.sample:
            _check(p in PARAM_NAMES, "prior.sample", f"names among {PARAM_NAMES}", p)
            _check(p in self.params, f"prior.params.{p}", "set for every sampled parameter", None)
            self.params[p].check(p)
        for p in self.params:
            _check(p in PARAM_NAMES, f"prior.params.{p}", f"a parameter among {PARAM_NAMES}", p)


ESTIMATORS = ("joint", "muse")
MUSE_SPREADS = ("mesh", "processes")


@dataclass
class MuseConfig:
    """``fli-map inference.map.estimator=muse``: the MUSE estimate of the parameters
    (fli/infer/muse.py), after the joint MAP."""

    n_sims: int = 32  # simulations per iteration (their scores' mean and covariance)
    iterations: int = 8  # Newton iterations at most (may be raised to continue a run)
    tol: float = 0.05  # stop when every parameter's Newton step is below tol MUSE sds
    # H's central-difference step in the standardised parameters: the PM fits' end points jitter
    # (kinks in U), and H's noise from that falls as 1/fd_step; truncation 0.7 % at 0.2 (docs/muse.md)
    fd_step: float = 0.2
    map_steps: int = 1000  # optimiser steps per field MAP at most
    # optimiser steps per refit of H's finite differences at most (each starts from its
    # simulation's MAP at theta); null: map_steps
    h_steps: int | None = None
    # where Newton's iteration starts: null, the prior's median; or theta_z, the standardised
    # latents (one per sampled parameter, a priori N(0, 1)), e.g. another run's MUSE estimate
    start: list[float] | None = None
    gtol: float = 1e-4  # a field MAP stops when its gradient's RMS per cell is below gtol
    # "mesh": each fit sharded over every device of every process, one fit after another;
    # "processes": each process fits its own share of the simulations on its own devices
    spread: str = "mesh"

    def __post_init__(self) -> None:
        _check(self.n_sims >= 4, "inference.map.muse.n_sims", ">= 4 (their covariance is J)", self.n_sims)
        for k in ("iterations", "map_steps"):
            _check(getattr(self, k) >= 1, f"inference.map.muse.{k}", ">= 1", getattr(self, k))
        _check(self.h_steps is None or self.h_steps >= 1, "inference.map.muse.h_steps", "null (map_steps) or >= 1",
               self.h_steps)
        if self.start is not None:
            ok = isinstance(self.start, (list, tuple)) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.start)
            _check(ok and _finite(*self.start), "inference.map.muse.start",
                   "null (the prior's median) or a list of finite standardised latents, one per sampled parameter",
                   self.start)
            self.start = [float(v) for v in self.start]
        for k in ("tol", "fd_step", "gtol"):
            v = getattr(self, k)
            _check(_finite(v) and v > 0, f"inference.map.muse.{k}", "> 0", v)
        _check(self.spread in MUSE_SPREADS, "inference.map.muse.spread", " or ".join(map(repr, MUSE_SPREADS)),
               self.spread)


@dataclass
class MapConfig:
    """``fli-map``: maximise the log posterior over (theta, s) with Optax."""

    optimizer: str = "lbfgs"  # "lbfgs" (zoom line search) | "adam"
    steps: int = 200  # step budget (may be raised to extend a run)
    lr: float = 0.02  # Adam's peak learning rate (in the standardised latents)
    schedule: str = "cosine"  # Adam: "constant" | "cosine" | "exponential" decay to lr * lr_final
    lr_final: float = 0.1
    lbfgs_memory: int = 10
    tol: float = 1e-6  # stop when |relative loss change| < tol for `patience` steps (float32 round-off ~6e-8)
    patience: int = 5
    anneal: bool = False  # smooth the kappa residual, large to small scale, before the exact stage
    anneal_arcmin: list[float] = field(default_factory=lambda: [16.0, 8.0, 4.0, 2.0])
    anneal_steps: int = 40  # steps per smoothing stage (the final, unsmoothed stage uses the rest)
    fix_cosmology: bool = False  # field-only MAP at the config's cosmology
    checkpoint_every: int = 25
    laplace: bool = True
    cg_tol: float = 1e-5
    cg_maxiter: int = 1000
    compare_truth: Optional[bool] = None  # r(k), T(k), r_ell against a mock's truth; None: when present
    # the parameters' estimate: "joint" (the joint MAP and its Laplace width) | "muse" (the joint
    # MAP, then MUSE's estimate and covariance beside it; fli/infer/muse.py)
    estimator: str = "joint"
    muse: MuseConfig = field(default_factory=MuseConfig)

    def __post_init__(self) -> None:
        _check(self.estimator in ESTIMATORS, "inference.map.estimator", " or ".join(map(repr, ESTIMATORS)),
               self.estimator)
        _check(self.optimizer in ("lbfgs", "adam"), "inference.map.optimizer", "'lbfgs' or 'adam'", self.optimizer)
        _check(self.schedule in ("constant", "cosine", "exponential"), "inference.map.schedule",
               "'constant', 'cosine' or 'exponential'", self.schedule)
        for k in ("steps", "patience", "lbfgs_memory", "anneal_steps", "checkpoint_every", "cg_maxiter"):
            _check(getattr(self, k) >= 1, f"inference.map.{k}", ">= 1", getattr(self, k))
        _check(_finite(self.lr) and self.lr > 0, "inference.map.lr", "> 0", self.lr)
        _check(_finite(self.lr_final) and 0 < self.lr_final <= 1, "inference.map.lr_final", "in (0, 1]",
               self.lr_final)
        _check(_finite(self.tol) and self.tol >= 0, "inference.map.tol", ">= 0", self.tol)
        _check(_finite(self.cg_tol) and 0 < self.cg_tol < 1, "inference.map.cg_tol", "in (0, 1)", self.cg_tol)
        _check(all(_finite(s) and s > 0 for s in self.anneal_arcmin), "inference.map.anneal_arcmin",
               "positive smoothing scales [arcmin]", list(self.anneal_arcmin))


INIT_REDRAWS = ("wiener", "none")
INIT_THETAS = ("auto", "map", "prior", "muse")
SAMPLERS = ("sharded", "numpyro")
KERNELS = ("nuts", "hmc", "mclmc", "adjusted_mclmc")
INTEGRATORS = ("mclachlan", "leapfrog")
MCLMC_LENGTHS = ("variance", "autocorrelation")
PRECONDITIONERS = ("none", "lowrank")


@dataclass
class InferenceConfig:
    """``fli-map`` (``map``) and ``fli-sample``, ``fli-nuts`` (the rest): see docs/nuts.md."""

    map: MapConfig = field(default_factory=MapConfig)
    kernel: str = "nuts"  # "nuts" | "hmc" (NumPyro's) | "mclmc" | "adjusted_mclmc" (fli's; sampler=sharded)
    integrator: str = "mclachlan"  # MCLMC's splitting of a step: "mclachlan" (2 gradients) | "leapfrog" (1)
    # MCLMC's trajectory length L at the warm-up's end: "variance" (sqrt of the summed variances) |
    # "autocorrelation" (then from the decorrelation of a few projections; fli/infer/mclmc.py)
    mclmc_length: str = "variance"
    # MCLMC: the energy error's variance per dimension its warm-up tunes the step size to; its bias
    # grows with it (docs/benchmarks.md measures it against adjusted MCLMC)
    mclmc_energy_error: float = 5e-6  # 1e-4 until 2026-12-05, 5e-4 before 2026-12-04 (docs/benchmarks.md)
    num_warmup: int = 200  # warm-up transitions: step size and diagonal mass matrix adapted
    num_samples: int = 200  # draws after warm-up (may be raised to extend a run)
    max_tree_depth: int = 6  # NUTS
    num_steps: int = 16  # HMC: leapfrog steps per trajectory
    step_size: float = 0.1  # the first step size (then dual averaging)
    target_accept: float = 0.8  # dual averaging's target acceptance probability
    chunk: int = 50  # draws per chunk: outputs and a checkpoint after each
    field_thin: int = 50  # every field_thin-th draw's white noise and kappa to zarr; divides chunk
    # init=<map dir>: redraw the modes the data leave free ("wiener") or start at the MAP's field ("none").
    # "wiener" before 2026-12-04: its |k|-shell W(k) is ~0 in every shell for lensing, so it adds unit
    # noise to the modes the data fix too, and MCLMC's parameters then ran to the prior's edges
    # (docs/benchmarks.md, "Where a chain starts")
    init_redraw: str = "none"
    # init=<map dir>: where theta starts: "map" (the joint MAP's, biased), "prior" (a draw), "muse" (a draw
    # of the run's MUSE estimate and covariance, with the data's field MAP there) | "auto": muse where
    # the run has a MUSE estimate, else map (prior in a preconditioned latent)
    init_theta: str = "auto"
    chains_per_run: int = 1  # chains vectorised in one run (one program, jax.vmap); a sweep adds runs
    sampler: str = "sharded"  # latent layout: "sharded" (flat, every device its block) | "numpyro" (NumPyro's own)
    # the latent the kernel moves: "none" (the standardised one) | "lowrank" (z = ref + C^1/2 y, C from
    # precondition_rank Lanczos steps on the Gauss-Newton Hessian at init=<fli-map run>; fli/infer/precondition.py)
    precondition: str = "none"
    precondition_rank: int = 128
    precondition_points: int = 0  # lowrank: 0 = curvature at the MAP; K = averaged over K linearised draws
    # K data-constrained field directions whose projections every draw records for fli-diagnose
    # (the preconditioner's top K, else a Lanczos pass at init=<fli-map run>); 0: none
    projections: int = 0

    def __post_init__(self) -> None:
        for k in ("num_samples", "max_tree_depth", "num_steps", "chunk", "field_thin"):
            _check(getattr(self, k) >= 1, f"inference.{k}", ">= 1", getattr(self, k))
        _check(self.num_warmup >= 0, "inference.num_warmup", ">= 0", self.num_warmup)
        _check(self.kernel in KERNELS, "inference.kernel", "'nuts', 'hmc', 'mclmc' or 'adjusted_mclmc'", self.kernel)
        _check(self.integrator in INTEGRATORS, "inference.integrator", "'mclachlan' or 'leapfrog'", self.integrator)
        _check(_finite(self.mclmc_energy_error) and 0 < self.mclmc_energy_error < 1, "inference.mclmc_energy_error",
               "in (0, 1)", self.mclmc_energy_error)
        _check(self.mclmc_length in MCLMC_LENGTHS, "inference.mclmc_length", "'variance' or 'autocorrelation'",
               self.mclmc_length)
        _check(_finite(self.target_accept) and 0 < self.target_accept < 1, "inference.target_accept",
               "in (0, 1)", self.target_accept)
        _check(_finite(self.step_size) and self.step_size > 0, "inference.step_size", "> 0", self.step_size)
        _check(self.chunk % self.field_thin == 0, "inference.field_thin",
               f"a divisor of inference.chunk = {self.chunk}", self.field_thin)
        _check(self.init_redraw in INIT_REDRAWS, "inference.init_redraw", "'wiener' or 'none'", self.init_redraw)
        _check(self.init_theta in INIT_THETAS, "inference.init_theta", "'auto', 'map', 'prior' or 'muse'",
               self.init_theta)
        _check(self.chains_per_run >= 1, "inference.chains_per_run", ">= 1", self.chains_per_run)
        _check(self.sampler in SAMPLERS, "inference.sampler", "'sharded' or 'numpyro'", self.sampler)
        _check(self.precondition in PRECONDITIONERS, "inference.precondition", "'none' or 'lowrank'",
               self.precondition)
        _check(self.precondition_rank >= 1, "inference.precondition_rank", ">= 1", self.precondition_rank)
        _check(self.projections >= 0, "inference.projections", ">= 0 (0: none)", self.projections)
        _check(self.precondition_points >= 0, "inference.precondition_points", ">= 0 (0: at the MAP alone)",
               self.precondition_points)
        _check(self.precondition == "none" or self.sampler == "sharded", "inference.sampler",
               f"'sharded' with inference.precondition={self.precondition} (it acts on the flat latent)",
               self.sampler)
        _check(not self.kernel.endswith("mclmc") or self.sampler == "sharded", "inference.sampler",
               f"'sharded' with inference.kernel={self.kernel} (MCLMC runs on the flat latent)", self.sampler)


@dataclass
class DistributedConfig:
    pdims: list[int] = field(default_factory=lambda: [1, 1])
    coordinator: Optional[str] = None  # "host:port"; None: auto-detect SLURM / Open MPI
    num_processes: Optional[int] = None
    process_id: Optional[int] = None
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
class DiagnoseConfig:
    """``fli-diagnose``: the bands of its checks (docs/diagnose.md) and what it draws.

    A check passes when its number is on the good side of ``*_pass``, warns when it is on the
    good side of ``*_warn`` only, and fails otherwise. Divergences pass only when there are none.
    """

    rhat_pass: float = 1.01  # rank-normalised split R-hat < rhat_pass
    rhat_warn: float = 1.05
    ess_pass: float = 400.0  # bulk and tail ESS > ess_pass (the chains together)
    ess_warn: float = 100.0
    bfmi_pass: float = 0.3  # E-BFMI of every chain > bfmi_pass
    bfmi_warn: float = 0.2
    divergence_warn: float = 0.001  # fraction of post-warm-up draws; none passes
    tree_depth_pass: float = 0.05  # fraction of draws at the run's max_tree_depth < tree_depth_pass
    tree_depth_warn: float = 0.20
    # MCLMC: Var(energy error) / dimension over the target its warm-up tuned it to (the run's
    # inference.mclmc_energy_error). Its bias grows with it: on tiny PM, chains 0.4-0.9x their
    # target gave S8 within 0.01 sd, chains up to 19x and 35x gave -0.09 and -0.15 sd, and up to
    # 81x -0.21 sd (docs/benchmarks.md, "MCLMC's step-size average restarted")
    energy_error_ratio_pass: float = 3.0
    energy_error_ratio_warn: float = 10.0
    figures: bool = True
    residual_draws: int = 3  # thinned draws shown in the posterior-predictive residual maps

    def __post_init__(self) -> None:
        _check(_finite(self.rhat_pass, self.rhat_warn) and 1 < self.rhat_pass <= self.rhat_warn,
               "diagnose.rhat_pass/rhat_warn", "1 < rhat_pass <= rhat_warn", (self.rhat_pass, self.rhat_warn))
        _check(_finite(self.ess_pass, self.ess_warn) and self.ess_pass >= self.ess_warn > 0,
               "diagnose.ess_pass/ess_warn", "ess_pass >= ess_warn > 0", (self.ess_pass, self.ess_warn))
        _check(_finite(self.bfmi_pass, self.bfmi_warn) and self.bfmi_pass >= self.bfmi_warn >= 0,
               "diagnose.bfmi_pass/bfmi_warn", "bfmi_pass >= bfmi_warn >= 0", (self.bfmi_pass, self.bfmi_warn))
        _check(_finite(self.divergence_warn) and 0 <= self.divergence_warn < 1, "diagnose.divergence_warn",
               "a fraction in [0, 1)", self.divergence_warn)
        _check(_finite(self.tree_depth_pass, self.tree_depth_warn)
               and 0 < self.tree_depth_pass <= self.tree_depth_warn <= 1, "diagnose.tree_depth_pass/tree_depth_warn",
               "fractions 0 < tree_depth_pass <= tree_depth_warn <= 1", (self.tree_depth_pass, self.tree_depth_warn))
        _check(_finite(self.energy_error_ratio_pass, self.energy_error_ratio_warn)
               and 0 < self.energy_error_ratio_pass <= self.energy_error_ratio_warn,
               "diagnose.energy_error_ratio_pass/energy_error_ratio_warn",
               "0 < energy_error_ratio_pass <= energy_error_ratio_warn",
               (self.energy_error_ratio_pass, self.energy_error_ratio_warn))
        _check(self.residual_draws >= 0, "diagnose.residual_draws", ">= 0", self.residual_draws)


@dataclass
class Config:
    cosmology: CosmologyConfig = field(default_factory=CosmologyConfig)
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    lensing: LensingConfig = field(default_factory=LensingConfig)
    survey: SurveyConfig = field(default_factory=SurveyConfig)
    prior: PriorConfig = field(default_factory=PriorConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    diagnose: DiagnoseConfig = field(default_factory=DiagnoseConfig)
    seed: int = 0
    run_dir: Optional[str] = None  # default: outputs/<command>/<timestamp>
    mock: Optional[str] = None  # path of a fli-mock run directory (for fli-map / fli-sample / fli-nuts)
    runs: Optional[list[str]] = None  # fli-diagnose: fli-sample/fli-nuts run directories
    sweep: Optional[str] = None  # fli-diagnose: a fli-sample/fli-nuts multirun directory (each job subdirectory a run)
    init: Optional[str] = None  # sampling start: null/"prior", "truth", a point (.json/.npz), a fli-map run dir
    progress: bool = True
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
