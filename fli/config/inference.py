"""Configuration schemas of the inference: the prior, fli-map (the joint MAP and MUSE), the
samplers and fli-diagnose; :class:`fli.config.Config` holds them beside the physics' groups."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fli.config.checks import _check, _finite


@dataclass
class ParamPrior:
    """Prior of one cosmological parameter. ``uniform`` on [low, high]; ``normal`` (loc, scale);
    ``truncated_normal`` (loc, scale) cut to [low, high]."""

    dist: str = "uniform"  # "uniform" | "normal" | "truncated_normal"
    low: float = 0.0  # uniform, truncated_normal: lower bound
    high: float = 1.0  # uniform, truncated_normal: upper bound
    loc: float = 0.0  # normal, truncated_normal: centre
    scale: float = 1.0  # normal, truncated_normal: width

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

    sample: list[str] = field(default_factory=lambda: ["Omega_c", "sigma8"])  # parameters sampled, each with prior.params.<name>
    # each sampled parameter's prior, a prior.params.<name> entry
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
MUSE_SPREADS = ("mesh", "processes", "files")
MUSE_ESTIMATES = ("posterior", "root")  # inference.map.muse.estimate


@dataclass
class MuseConfig:
    """``fli-map inference.map.estimator=muse``: the MUSE estimate of the parameters
    (fli/infer/muse/estimator.py), after the joint MAP."""

    n_sims: int = 32  # simulations per iteration (their scores' mean and covariance)
    # simulations for J at the last point (the first n_sims are the iteration's; the others cost
    # one fit each, no refits for H); null: 4 n_sims. MUSE's width rests on J, and 16 simulations
    # read it at 0.40-0.56x on tiny (docs/muse_studies.md, "J's Monte Carlo error")
    j_sims: int | None = None
    iterations: int = 8  # Newton iterations at most (may be raised to continue a run)
    tol: float = 0.05  # stop when every parameter's Newton step is below tol MUSE sds
    # H's central-difference step in the standardised parameters: the PM fits' end points jitter
    # (kinks in U), and H's noise from that falls as 1/fd_step; truncation 0.7 % at 0.2 (docs/muse_studies.md)
    fd_step: float = 0.2
    map_steps: int = 1000  # optimiser steps per field MAP at most
    # optimiser steps per refit of H's finite differences at most (each starts from its
    # simulation's MAP at theta); null: map_steps
    h_steps: int | None = None
    # where Newton's iteration starts: null, the prior's median; or theta_z, the standardised
    # latents (one per sampled parameter, a priori N(0, 1)), e.g. another run's MUSE estimate
    start: list[float] | None = None
    gtol: float = 1e-4  # a field MAP stops when its gradient's RMS per cell is below gtol
    # every field MAP moves in a space where the top precondition_rank eigenpairs of the data's
    # curvature J_s^T J_s (taken once, at the start's theta and s = 0) have unit curvature: 2-4x
    # fewer gradient evaluations a fit on tiny PM (fli/infer/muse/field_fit.py); 0: plain L-BFGS on s
    precondition_rank: int = 32
    # what theta_z reports: "posterior", the mean of the Gaussian posterior given the MUSE score
    # (the mean that goes with the reported covariance); "root", the root of F (Millea & Seljak's
    # estimate with a prior). They differ where J exceeds H (fli/infer/muse/result.py)
    estimate: str = "posterior"
    # "mesh": each fit sharded over every device of every process, one fit after another;
    # "processes": each process fits its own share of the simulations on its own devices;
    # "files": fli-map (one process) is worker 0 of `workers`, and `fli-muse-worker <run_dir> <k>`
    # runs worker k anywhere that sees the run directory: they meet through their score files
    # alone (no jax.distributed: a job array, machines with no network between them)
    spread: str = "mesh"
    workers: int = 1  # spread=files: the number of workers, fli-map's own included (>= 2)

    def __post_init__(self) -> None:
        _check(self.n_sims >= 4, "inference.map.muse.n_sims", ">= 4 (their covariance is J)", self.n_sims)
        for k in ("iterations", "map_steps"):
            _check(getattr(self, k) >= 1, f"inference.map.muse.{k}", ">= 1", getattr(self, k))
        _check(self.j_sims is None or self.j_sims >= self.n_sims, "inference.map.muse.j_sims",
               f"null (4 n_sims) or >= n_sims ({self.n_sims})", self.j_sims)
        _check(self.precondition_rank >= 0, "inference.map.muse.precondition_rank", ">= 0 (0: none)",
               self.precondition_rank)
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
        _check(self.workers >= (2 if self.spread == "files" else 1), "inference.map.muse.workers",
               ">= 2 with spread=files (fli-map is worker 0)" if self.spread == "files" else ">= 1", self.workers)
        _check(self.estimate in MUSE_ESTIMATES, "inference.map.muse.estimate",
               " or ".join(map(repr, MUSE_ESTIMATES)), self.estimate)


@dataclass
class MapConfig:
    """``fli-map``: maximise the log posterior over (theta, s) with Optax."""

    optimizer: str = "lbfgs"  # "lbfgs" (zoom line search) | "adam"
    steps: int = 200  # step budget (may be raised to extend a run)
    lr: float = 0.02  # Adam's peak learning rate (in the standardised latents)
    schedule: str = "cosine"  # Adam: "constant" | "cosine" | "exponential" decay to lr * lr_final
    lr_final: float = 0.1  # adam: the schedule decays to lr * lr_final
    lbfgs_memory: int = 10  # lbfgs: curvature pairs kept
    tol: float = 1e-6  # stop when |relative loss change| < tol for `patience` steps (float32 round-off ~6e-8)
    patience: int = 5  # steps below tol before the fit stops
    anneal: bool = False  # smooth the kappa residual, large to small scale, before the exact stage
    anneal_arcmin: list[float] = field(default_factory=lambda: [16.0, 8.0, 4.0, 2.0])  # anneal: the smoothing widths, one stage each
    anneal_steps: int = 40  # steps per smoothing stage (the final, unsmoothed stage uses the rest)
    fix_cosmology: bool = False  # field-only MAP at the config's cosmology
    checkpoint_every: int = 25  # an orbax checkpoint every N steps and at the end
    laplace: bool = True  # the parameters' marginal and conditional Laplace errors
    cg_tol: float = 1e-5  # Laplace: conjugate gradients' relative tolerance
    cg_maxiter: int = 1000  # Laplace: conjugate gradients' iterations at most
    compare_truth: Optional[bool] = None  # r(k), T(k), r_ell against a mock's truth; None: when present
    # the parameters' estimate: "joint" (the joint MAP and its Laplace width) | "muse" (the joint
    # MAP, then MUSE's estimate and covariance beside it; fli/infer/muse/estimator.py)
    estimator: str = "joint"
    muse: MuseConfig = field(default_factory=MuseConfig)  # estimator=muse's settings

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

    map: MapConfig = field(default_factory=MapConfig)  # fli-map's settings
    kernel: str = "nuts"  # "nuts" | "hmc" (NumPyro's) | "mclmc" | "adjusted_mclmc" (fli's; sampler=sharded)
    integrator: str = "mclachlan"  # MCLMC's splitting of a step: "mclachlan" (2 gradients) | "leapfrog" (1)
    # MCLMC's trajectory length L at the warm-up's end: "variance" (sqrt of the summed variances) |
    # "autocorrelation" (then from the decorrelation of a few projections; fli/infer/sample/mclmc.py)
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
    # precondition_rank Lanczos steps on the Gauss-Newton Hessian at init=<fli-map run>; fli/infer/sample/precondition.py)
    precondition: str = "none"
    precondition_rank: int = 128  # lowrank: Lanczos steps, 2 gradient evaluations each
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
class DiagnoseConfig:
    """``fli-diagnose``: the bands of its checks (docs/diagnose.md) and what it draws.

    A check passes when its number is on the good side of ``*_pass``, warns when it is on the
    good side of ``*_warn`` only, and fails otherwise. Divergences pass only when there are none.
    """

    rhat_pass: float = 1.01  # rank-normalised split R-hat < rhat_pass
    rhat_warn: float = 1.05  # warn below, fail above
    ess_pass: float = 400.0  # bulk and tail ESS > ess_pass (the chains together)
    ess_warn: float = 100.0  # warn above, fail below
    bfmi_pass: float = 0.3  # E-BFMI of every chain > bfmi_pass
    bfmi_warn: float = 0.2  # warn above, fail below
    divergence_warn: float = 0.001  # fraction of post-warm-up draws; none passes
    tree_depth_pass: float = 0.05  # fraction of draws at the run's max_tree_depth < tree_depth_pass
    tree_depth_warn: float = 0.20  # warn below, fail above
    # MCLMC: Var(energy error) / dimension over the target its warm-up tuned it to (the run's
    # inference.mclmc_energy_error). Its bias grows with it: on tiny PM, chains 0.4-0.9x their
    # target gave S8 within 0.01 sd, chains up to 19x and 35x gave -0.09 and -0.15 sd, and up to
    # 81x -0.21 sd (docs/benchmarks.md, "MCLMC's step-size average restarted")
    energy_error_ratio_pass: float = 3.0
    energy_error_ratio_warn: float = 10.0  # warn below, fail above
    figures: bool = True  # draw the figures (and the report's panels)
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
