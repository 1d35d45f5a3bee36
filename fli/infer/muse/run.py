"""MUSE inside ``fli-map`` (``inference.map.estimator=muse``): run, resume, report, draw.

After the joint MAP, :func:`run_muse` starts MUSE's iteration (fli.infer.muse.estimator) from the prior's
median (``theta_z = 0``; ``inference.map.muse.start`` sets another point, for example another
analysis's estimate of a similar data set), not from the joint MAP's theta: that one is biased, often several MUSE
sds out in a prior's tail (sigma8's latent at 2.1 on the tiny linear mock, against a truth at
0.04), where H is another matrix. The data's field MAP starts from zero, as every
simulation's does, and later from its own previous MAP, as they do: where a fit ends at its
step budget (the PM forward: the gradient's RMS stalls near 0.01 per cell while U still falls
by ~1e-3 per 100 steps) the estimator is still unbiased only if the data and the simulations
are fitted the same way. Every fit's score goes into
``muse_scores.jsonl`` as soon as it is known (one JSON object per line, with the name of the
fit and the theta it was taken at), so a run that stops resumes fit by fit: a new start on the
same run directory reads the file and repeats only the fits it lacks. Each iteration's summary
goes into ``muse_iterations.jsonl``. The result becomes map.json's ``muse`` block and the figure
``estimates.png``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from fli.infer.fit.map import Estimator
from fli.store.files import is_writer
from fli.infer.muse.estimator import Muse, ScoreStore, kinked
from fli.infer.muse.result import H_RESOLVED, MuseResult

SCORES = "muse_scores.jsonl"
ITERATIONS = "muse_iterations.jsonl"
FIELD = "muse_field.zarr"  # the data's field MAP at the estimate: a chain's start (fli.infer.sample.start)
PRECONDITIONER = "muse_preconditioner.zarr"  # the fits' preconditioner, built once per run (fits_preconditioner)

MUSE_NOTE = (
    "MUSE (Millea & Seljak 2022): the MUSE score s(theta) = g(theta, d) - <g(theta, x_i)>, where g is "
    "the joint likelihood's score in the standardised parameters at the field's MAP with theta held fixed, "
    "and x_i are n_sims simulations at theta, has mean zero at the true theta whatever the field MAP is. "
    "theta_root_z solves s(theta) - theta = 0 (the prior's score added). theta_z is, with estimate "
    "'posterior', the mean of theta's Gaussian posterior given s at that point (s moving as H and scattering "
    "as J), whose covariance (H^T J^-1 H + I)^-1 includes the prior; with estimate 'root', theta_root_z. The "
    "two agree where J = H. That Gaussian lives in the standardised "
    "parameters: params, sd and cov are its mean and covariance pushed through the prior transform, median "
    "and interval68 the estimate and its central 68 % interval through it. mc_sd is the Monte Carlo error of "
    "the estimate from the finite number of simulations, by resampling them (their mean score, H and J; "
    "theta_z_bootstrap_sd in the latents); mc_sd_z the mean score's part alone; sd_z_bootstrap_sd the "
    "Monte Carlo error of sd_z (resampling the simulations too).")


class JsonlStore(ScoreStore):
    """A :class:`~fli.infer.muse.estimator.ScoreStore` backed by JSON-lines files in ``run_dir``: every
    ``muse_scores*.jsonl`` is read at start (a line cut short by a stop is skipped); this
    worker's own file (``muse_scores.jsonl`` for worker 0, ``muse_scores.p<rank>.jsonl`` for
    the others of ``spread=processes`` or ``files``) is appended to and fsynced after every fit, where
    ``writes``. :meth:`wait` reads the other workers' files until the fits it needs are there."""

    POLL = (0.2, 5.0)  # [s] between reads of the other workers' files while waiting: the first, and at most

    def __init__(self, run_dir: Path, rank: int = 0, writes: bool = True, log: logging.Logger | None = None):
        super().__init__()
        run_dir = Path(run_dir)
        self.path = run_dir / (SCORES if rank == 0 else f"muse_scores.p{rank}.jsonl")
        self.writes, self.log = writes, log or logging.getLogger("fli")
        self.waiting_hint = ""  # what the wait's log line adds: who holds the missing fits
        self.n_read = 0
        for p in sorted(run_dir.glob("muse_scores*.jsonl")):
            good = self._read(p)
            self.n_read += len(good)
            if p == self.path and writes:  # without the cut line, so that the next record starts a line of its own
                tmp = p.with_name(p.name + ".tmp")
                tmp.write_text("".join(g + "\n" for g in good))
                os.replace(tmp, p)

    def _read(self, path: Path) -> list[str]:
        good = []
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # cut short by a stop (or still being written): that fit is not here
                continue
            good.append(line)
            self._d[rec.pop("name")] = rec
        return good

    def put(self, name: str, rec: dict) -> None:
        super().put(name, rec)
        if self.writes:
            with open(self.path, "a") as f:
                f.write(json.dumps({"name": name, **rec}) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def wait(self, names: list[str], theta: np.ndarray) -> None:
        """Read the other workers' files until every one of ``names`` is there at ``theta``. A
        process that dies under ``spread=processes`` stops this one through jax.distributed's
        heartbeat; under ``spread=files`` this one waits until the worker is started again."""
        t0 = last = time.monotonic()
        pause = self.POLL[0]
        while True:
            missing = [n for n in names if self.get(n, theta) is None]
            if not missing:
                return
            if time.monotonic() - last > 60:
                last = time.monotonic()
                self.log.info("MUSE: waiting %.0f s for %d fits of the other workers (%s, ...)%s",
                              last - t0, len(missing), missing[0], self.waiting_hint)
            time.sleep(pause)
            pause = min(1.5 * pause, self.POLL[1])  # a long wait (fits of hours) reads the files seldom
            for p in self.path.parent.glob("muse_scores*.jsonl"):
                if p != self.path:
                    self._read(p)


def local_pdims(pdims, processes: int) -> tuple[int, int]:
    """Each process's mesh under ``spread=processes``: ``pdims`` divided by the number of
    processes along its first axis that is a multiple of it."""
    from fli.config import ConfigError  # noqa: PLC0415
    from fli.sim.sharding import parse_pdims  # noqa: PLC0415

    px, py = parse_pdims(pdims)
    if px % processes == 0:
        return px // processes, py
    if py % processes == 0:
        return px, py // processes
    raise ConfigError(f"inference.map.muse.spread=processes divides distributed.pdims {[px, py]} among {processes} "
                      f"processes, but neither axis is a multiple of {processes}: choose pdims with one that is, "
                      f"or spread=mesh")


def local_posterior(cfg):
    """This process's own posterior and data for ``spread=processes``: the observation read
    again onto a mesh of this process's devices, ``distributed.pdims`` divided by the number
    of processes along whichever axis it divides."""
    import jax  # noqa: PLC0415

    from fli.infer.posterior.model import build_posterior, make_data  # noqa: PLC0415
    from fli.store.io import load_observation  # noqa: PLC0415
    from fli.sim.sharding import make_mesh  # noqa: PLC0415

    local = local_pdims(cfg.distributed.pdims, jax.process_count())
    mesh = make_mesh(local, jax.local_devices()[:local[0] * local[1]])
    obs = load_observation(cfg.mock, mesh)
    post = build_posterior(cfg, obs, mesh=mesh)
    return post, make_data(obs, post.fwd, post.ell_max)


def stored_preconditioner(path: Path, post, theta0, rank: int):
    """The fits' preconditioner stored at ``path`` (:func:`fits_preconditioner`) and its
    summary, where it is complete and was built at ``theta0`` with ``rank``; else None and
    why not."""
    from fli.infer.fit.lowrank import load_lowrank  # noqa: PLC0415
    from fli.store.io import COMPLETE  # noqa: PLC0415

    if not (Path(path) / COMPLETE).is_file():
        return None, "is incomplete (a stop while it was written)"
    pre, info = load_lowrank(path, post)
    start, have = np.asarray(info.get("theta_start", []), np.float64), int(pre.lam.shape[0])
    if have == rank and start.shape == np.shape(theta0) and np.array_equal(start, theta0):
        return pre, info
    return None, (f"was built at theta_z {start.tolist()} with rank {have}, not at this run's "
                  f"{np.asarray(theta0).tolist()} with rank {rank}")


def fits_preconditioner(post, data, theta0, rank: int, run_dir: Path, local: bool, log: logging.Logger):
    """The field fits' preconditioner (:func:`fli.infer.muse.field_fit.field_preconditioner`) at
    ``theta0``: read from ``run_dir``/:data:`PRECONDITIONER` where a previous start of this run
    stored it, else built and stored there. A resume then neither compiles nor runs its Lanczos
    build again (80 s on tiny PM, its compile included: pair 0's run, 2026-12-07), and every
    fit of the run, before and after the resume, uses the same one. ``local``: ``post`` is this
    process's own mesh (``spread=processes``); every process builds the same one and process 0
    stores it."""
    from fli.infer.muse.field_fit import field_preconditioner  # noqa: PLC0415
    from fli.infer.fit.lowrank import save_lowrank  # noqa: PLC0415

    path = Path(run_dir) / PRECONDITIONER
    if path.exists():
        pre, info = stored_preconditioner(path, post, theta0, rank)
        if pre is not None:
            log.info("MUSE: the fits' preconditioner read from %s (built in %.1f s)", path, info["seconds"])
            return pre, info
        log.warning("MUSE: %s %s: building it again", path, info)
    pre, info = field_preconditioner(post, data, theta0, rank, log)
    info = {**info, "theta_start": np.asarray(theta0, np.float64).tolist()}
    save_lowrank(path, post, pre, info, local=local)
    return pre, info


def run_muse(cfg, run_dir: Path, post, data, log: logging.Logger) -> MuseResult:
    """MUSE on ``data`` into ``run_dir`` (see the module docstring). With
    ``inference.map.muse.spread=processes`` and several processes, each process fits its own
    share of the simulations on its own devices (:func:`local_posterior`)."""
    import jax  # noqa: PLC0415

    run_dir = Path(run_dir)
    settings = cfg.inference.map.muse
    spread = settings.spread == "processes" and jax.process_count() > 1
    rank, size = (jax.process_index(), jax.process_count()) if spread else (0, 1)
    if settings.spread == "files":
        size = settings.workers
    store = JsonlStore(run_dir, rank, writes=spread or is_writer(), log=log)
    if store.n_read:
        log.info("MUSE: resuming with %d fits already in %s", store.n_read, run_dir / SCORES)
    if spread:
        post, data = local_posterior(cfg)
        log.info("MUSE: the fits spread over %d processes, each on its own %s mesh", size,
                 "x".join(map(str, post.fwd.grid.pdims)))
    if settings.spread == "files":
        store.waiting_hint = f"; a worker that stopped is started again with `fli-muse-worker {run_dir} <k>`"
        log.info("MUSE: worker 0 of %d; the others run `fli-muse-worker %s <k>` (k = 1..%d) wherever this run "
                 "directory can be read and written, and meet this one through their score files", size,
                 run_dir, size - 1)
    start = settings.start
    theta0 = np.zeros(post.prior.n) if start is None else np.asarray(start, np.float64)
    pre = None
    if settings.precondition_rank:
        pre, info = fits_preconditioner(post, data, theta0, settings.precondition_rank, run_dir, spread, log)
        log.info("MUSE: every field fit preconditioned by the top %d directions of the data's curvature at the "
                 "start (eigenvalues %.3g to %.3g; %d gradient evaluations)", info["rank"], info["eigenvalues"][0],
                 info["eigenvalues"][-1], info["grad_evals"])
    m = Muse(post, data, settings, cfg.inference.map, seed=cfg.seed, store=store, log=log, rank=rank, size=size,
             pre=pre)
    log.info("MUSE of %s: %d simulations per iteration, up to %d Newton iterations, from %s",
             ", ".join(post.names), settings.n_sims, settings.iterations,
             "the prior's median" if start is None else
             f"theta_z = {np.round(theta0, 4).tolist()} (inference.map.muse.start)")
    if kinked(post.fwd):
        log.warning("MUSE on the PM forward with simulation.assignment=cic: CIC puts kinks in the potential where "
                    "the field fits stall, so H and J come out noisy and MUSE reads wide; "
                    "simulation.assignment=tsc (for the mock too) makes it smooth (docs/muse_studies.md)")
    if is_writer():
        (run_dir / ITERATIONS).unlink(missing_ok=True)

    def on_iteration(rec):
        if is_writer():
            with open(run_dir / ITERATIONS, "a") as f:
                f.write(json.dumps(rec) + "\n")

    res = m.run(theta0, on_iteration=on_iteration)
    if pre is not None:
        res.preconditioner = {"rank": info["rank"], "grad_evals": info["grad_evals"], "seconds": info["seconds"],
                              "eigenvalue_largest": info["eigenvalues"][0],
                              "eigenvalue_smallest": info["eigenvalues"][-1]}
    for name in res.unresolved():
        i = res.names.index(name)
        log.warning("MUSE: H's diagonal for %s is %.3g +- %.2g (its Monte Carlo se, %d simulations), not above %g "
                    "se: the simulations do not resolve how %s moves their scores, so its sd leans on the prior. "
                    "Raise inference.map.muse.n_sims; on the PM forward also fd_step and h_steps (fits that end at "
                    "their step budget blur H, docs/muse_studies.md)", name, res.h[i, i], res.h_se[i, i],
                    res.h_columns.shape[0], H_RESOLVED, name)
    if spread:
        log.info("MUSE: no %s (the fits ran on each process's own mesh): a chain started from this run takes "
                 "the joint MAP's field", FIELD)
        return res
    from fli.store.io import mark_complete, write_arrays  # noqa: PLC0415

    t0 = time.perf_counter()
    s, evals = m.data_field(res.theta_z)
    info = {"units": "unit Gaussian per cell", "theta_z": res.theta_z.tolist(), "grad_evals": evals,
            "pdims": list(post.fwd.grid.pdims)}
    write_arrays(run_dir / FIELD, {"white_noise": s}, info)
    mark_complete(run_dir / FIELD, info)
    log.info("MUSE: the data's field MAP at the estimate in %.1f s (%d gradient evaluations) -> %s",
             time.perf_counter() - t0, evals, run_dir / FIELD)
    return res


def muse_block(res: MuseResult, post, settings, truth: dict | None) -> dict:
    """map.json's ``muse`` block: every number in it is MUSE's."""
    boot_cov = res.theta_bootstrap_cov()  # the estimate's Monte Carlo error with H's and J's noise
    if not np.all(np.isfinite(boot_cov)):  # too few simulations to resample: the mean score's part
        boot_cov = res.mc_cov_z
    phys = res.physical(post, mc_cov=boot_cov)
    boot = res.bootstrap_sd()
    out = {"estimator": "muse", "description": MUSE_NOTE, "params": phys["value"], "sd": phys["sd"],
           "cov": phys["cov"], "cov_names": phys["names"], "median": phys["median"],
           "interval68": phys["interval68"], "mc_sd": phys["mc_sd"],
           "estimate": res.estimate, "theta_z": res.theta_z.tolist(),
           "theta_root_z": None if res.theta_root_z is None else res.theta_root_z.tolist(),
           "root_median": phys["root_median"],
           "cov_z": res.cov_z.tolist(), "sd_z": res.sd_z.tolist(),
           "sd_z_bootstrap_sd": boot.tolist(), "mc_sd_z": np.sqrt(np.diag(res.mc_cov_z)).tolist(),
           "theta_z_bootstrap_sd": np.sqrt(np.diag(boot_cov)).tolist(),
           "H": res.h.tolist(), "H_se": res.h_se.tolist(), "h_unresolved": res.unresolved(),
           "J": res.j.tolist(), "converged": res.converged,
           "iterations": len(res.history), "history": res.history, "grad_evals": res.grad_evals,
           "grad_evals_this_run": res.grad_evals_here, "preconditioner": res.preconditioner,
           "seconds": res.seconds, "settings": dataclasses.asdict(settings),
           "units": "params, sd, cov: the mean and covariance of MUSE's latent Gaussian pushed through the prior "
                    "transform; median, interval68: the estimate and its central 68 % interval through it (for Omega_m "
                    "and S8, which depend on several latents, the interval's ends are the 16th and 84th percentiles "
                    "of 200000 draws of the Gaussian through it); "
                    "root_median: theta_root_z through it; "
                    "mc_sd: the bootstrap's covariance through the transform (delta method); "
                    "*_z: standardised latents; "
                    "H_se: H's Monte Carlo standard error; "
                    f"h_unresolved: the parameters whose diagonal of H is not above {H_RESOLVED:g} H_se (their sd "
                    "leans on the prior); "
                    "grad_evals: of every fit the estimate used (all processes, before any resume); "
                    "grad_evals_this_run: of the fits this process made in this run; "
                    "preconditioner: the fits' preconditioner and its own cost (null: plain fits), "
                    "outside grad_evals"}
    if truth:
        out["pull"] = {k: (phys["value"][k] - truth[k]) / phys["sd"][k] for k in truth if k in phys["value"]}
    return out


def estimates_figure(out: dict, path: Path) -> Path:
    """Each parameter's joint MAP (Laplace marginal width) and MUSE estimate, with the truth
    where the mock has one. MUSE is drawn as its mean and sd (a dot and a bar) and, for a
    sampled parameter, its median and central 68 % interval (a thick bar, asymmetric near a
    prior's bound)."""
    from fli.plots import pyplot, save_figure  # noqa: PLC0415

    plt = pyplot()
    muse = out["muse"]
    names = [k for k in muse["params"] if k != "Omega_m" or "Omega_c" not in muse["params"]]
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.3), layout="constrained", squeeze=False)
    lap = ((out.get("laplace") or {}).get("marginal") or {}).get("std", {})
    for ax, k in zip(axes[0], names, strict=True):
        ax.errorbar([muse["params"][k]], [1], xerr=[muse["sd"][k]], fmt="o", color="C0", capsize=3,
                    label="MUSE mean, sd")
        if k in muse.get("interval68", {}):
            lo, hi = muse["interval68"][k]
            ax.plot([lo, hi], [1.15, 1.15], color="C0", lw=4, alpha=0.5, solid_capstyle="butt",
                    label="MUSE 68 % interval")
            ax.plot([muse["median"][k]], [1.15], "|", color="C0", ms=10)
        if (muse.get("root_median") or {}).get(k) is not None and muse.get("estimate") == "posterior":
            ax.plot([muse["root_median"][k]], [1.3], "v", color="C0", mfc="none", ms=6,
                    label="MUSE's root of F (estimate=root)")
        ax.errorbar([out["params"][k]], [0], xerr=[lap[k]] if k in lap else None, fmt="s", color="C1", capsize=3,
                    label="joint MAP" + (" (Laplace)" if k in lap else ""))
        if k in (out.get("truth") or {}):
            ax.axvline(out["truth"][k], color="k", ls="--", lw=1, label="truth")
        ax.set_yticks([0, 1], ["joint MAP", "MUSE"])
        ax.set_ylim(-0.7, 1.7)
        ax.set_xlabel(k)
    fig.legend(*axes[0][0].get_legend_handles_labels(), fontsize=7, loc="outside lower center", ncols=4)
    fig.suptitle(f"parameter estimates ({muse['settings']['n_sims']} simulations, "
                 f"{muse['iterations']} MUSE iteration{'' if muse['iterations'] == 1 else 's'}"
                 f"{'' if muse['converged'] else ', not converged'})")
    return save_figure(fig, path)


def check_config(cfg, post, cosmology_fixed: bool) -> None:
    """Refuse, before the joint MAP, a config that MUSE cannot run (every check names its key)."""
    import jax  # noqa: PLC0415

    from fli.config import ConfigError  # noqa: PLC0415

    mcfg = cfg.inference.map
    if cosmology_fixed or not post.prior.n:
        why = "inference.map.fix_cosmology is true" if cosmology_fixed else "prior.sample is empty"
        raise ConfigError(f"inference.map.estimator=muse estimates the sampled parameters, but {why}: "
                          f"set inference.map.estimator=joint, or sample parameters")
    if mcfg.muse.start is not None and len(mcfg.muse.start) != post.prior.n:
        raise ConfigError(f"inference.map.muse.start has {len(mcfg.muse.start)} values: give one standardised "
                          f"latent per sampled parameter ({', '.join(post.names)}), or null for the prior's median")
    if mcfg.muse.spread == "files" and jax.process_count() > 1:
        raise ConfigError(f"inference.map.muse.spread=files: fli-map is worker 0, one process, but this run has "
                          f"{jax.process_count()}: run it in one process, or use spread=processes")
    if mcfg.muse.spread == "processes":
        local_pdims(cfg.distributed.pdims, jax.process_count())


def muse_after_map(cfg, run_dir: Path, post, data, log: logging.Logger, truth: dict | None) -> dict:
    """MUSE run (or resumed) after fli-map's joint MAP: its map.json block, logged."""
    res = run_muse(cfg, run_dir, post, data, log)
    m = muse_block(res, post, cfg.inference.map.muse, truth)
    log.info("MUSE: %s after %d iterations%s", " ".join(f"{k}={m['params'][k]:.4f}+-{m['sd'][k]:.4f}"
                                                      for k in m["params"]),
             m["iterations"], "" if m["converged"] else " (NOT converged: raise inference.map.muse.iterations)")
    return m


MUSE = Estimator(note="MUSE (every number in the block)", check=check_config, run=muse_after_map,
                 figure=estimates_figure)

