"""``fli-map``'s work: the MAP of (theta, s), its Laplace error, its comparison with a truth.

Run directory (every process the same; process 0 writes the small files, each process its
own blocks of the zarr field):

* ``config.yaml``: the resolved config;
* ``checkpoints/<step>``: orbax checkpoints of the parameters, the field, the optimiser state,
  the step and the key (:mod:`fli.infer.checkpoint.store`); a new start on the same directory
  resumes from the last complete one, also on another device layout, and refuses a directory
  made with another model config, naming the key;
* ``loss_history.csv``: step, loss, gradient norm, evaluations, seconds, stage;
* ``map_field.zarr``: the MAP white noise ``[nx, ny, nz]`` (:func:`load_map_field` reads it on any layout);
* ``metrics.json`` (with a truth): r(k), T(k) and r_ell (:mod:`fli.infer.fit.metrics`);
* figures: ``loss.png``, ``kappa_maps.png``, ``residuals.png``, and with a truth
  ``transfer.png``, ``r_ell.png``, ``field_slices.png``;
* ``laplace.json``: the Laplace step's block with the point and settings it was computed at;
  a start that finds the fit already at its end (a MUSE run stopped after its Laplace step)
  reads it back instead of computing it again, and compiles no optimiser step either;
* ``map.json``, written last: the MAP parameters, loss, steps, time, gradient evaluations,
  the marginal and conditional Laplace errors, and what the joint MAP is and is not.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from fli.config import Config, ConfigError
from fli.store.files import barrier, write_json, write_text
from fli.infer.checkpoint import store as ckpt
from fli.infer.config_keys import MAP_MAY_CHANGE, check_resumable
from fli.infer.posterior.model import Data, Latents, Posterior
from fli.infer.posterior.setup import prepare
from fli.infer.fit.optimize import MapRun, converged, history_array, init_state, make_step, run_map
from fli.infer.posterior.summaries import linear_field_of, truth_linear_field
from fli.store.manifest import check_kind, check_same_observation, read_manifest, write_manifest

COMMAND = "fli-map"
MAP_JSON = "map.json"
LAPLACE_JSON = "laplace.json"
FIELD_NAME = "map_field.zarr"

JOINT_MAP_NOTE = (
    "The joint MAP maximises p(theta, s | d) over the cosmological parameters and the white-noise field "
    "together. It is not the maximum of the marginal posterior p(theta | d): it leaves out the volume "
    "(log-determinant) term of the field, and when many modes are data-dominated an amplitude such as sigma8 "
    "is biased (Seljak et al. 2017; Millea & Seljak 2022). laplace.marginal is the Gaussian width of theta "
    "with the field marginalised around this point; it is not a posterior error bar where the joint-MAP bias "
    "exceeds it (docs/benchmarks.md measures that bias). For parameters with honest errors from MAP fits alone use "
    "inference.map.estimator=muse (the muse block); for the posterior, fli-sample.")


class Estimator(NamedTuple):
    """A parameter estimator run after the joint MAP, into the same run directory and ``map.json``
    (MUSE: :data:`fli.infer.muse.MUSE`). fli-map's caller hands it in, so that the fit does not
    import the estimators built on top of it."""

    note: str  # what map.json's ``estimators`` says of its block
    check: Callable[[Config, Posterior, bool], None]  # (cfg, post, cosmology fixed): refuses a config before the fit
    run: Callable[..., dict]  # (cfg, run_dir, post, data, log, truth | None) -> its map.json block
    figure: Callable[[dict, Path], Path]  # (map.json's content, path) -> the figure written


def _fixed_theta(cfg: Config, post: Posterior):
    if not cfg.inference.map.fix_cosmology:
        return None
    return post.theta_of(cfg.cosmology.parameters())


def _state(run: MapRun) -> dict:
    return {"params": run.params, "opt_state": run.opt_state, "key": jax.random.key_data(run.key)}


def _left(seconds: float) -> str:
    """A time left, as a progress line says it (the step budget's: the fit may stop sooner)."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def fit_map(cfg: Config, resolved: dict, run_dir: Path, log: logging.Logger,
            estimators: Mapping[str, Estimator] | None = None) -> dict:
    """Fit (or resume) the MAP into ``run_dir``; returns the content of ``map.json``.

    ``estimators``: the parameter estimators that ``inference.map.estimator`` may name beside ``joint``,
    run after the joint MAP into the same directory (fli-map gives ``{"muse": fli.infer.muse.MUSE}``)."""
    from fli.sim.host import release_freed_memory  # noqa: PLC0415

    run_dir = Path(run_dir)
    check_kind(run_dir, COMMAND)
    mcfg = cfg.inference.map
    obs, post, data = prepare(cfg, log)
    if (run_dir / MAP_JSON).exists():
        raise ConfigError(f"run_dir {run_dir} already holds a finished MAP ({MAP_JSON}): choose another run_dir "
                          f"(or raise inference.map.steps after removing {MAP_JSON} to continue it)")
    ckpt_dir = run_dir / "checkpoints"
    last, meta = ckpt.newest_readable(ckpt_dir, log)  # a collective: every process asks
    if last is not None:
        check_resumable(meta["config"], resolved, MAP_MAY_CHANGE, where=f"run_dir {run_dir}")
        check_same_observation((read_manifest(run_dir) or {}).get("observation"), obs, f"run_dir {run_dir}",
                               legacy_path=meta["config"].get("mock"))
    theta_fixed = _fixed_theta(cfg, post)
    est = None
    if mcfg.estimator != "joint":
        est = (estimators or {}).get(mcfg.estimator)
        if est is None:
            raise ConfigError(f"inference.map.estimator={mcfg.estimator}: this caller of fit_map runs "
                              f"{', '.join(['joint', *(estimators or {})])}")
        est.check(cfg, post, theta_fixed is not None)  # refused now, not after the joint MAP
    step_fn, opt = make_step(post, mcfg, theta_fixed)
    init = post.zeros()
    if theta_fixed is not None:
        init = Latents(jnp.asarray(theta_fixed, init.theta.dtype), init.s)
    run = MapRun(init, init_state(opt, init, post), 0, [], jax.random.key(cfg.seed))
    if last is not None:
        target = _state(run)
        (state, meta), last, _ = ckpt.restore_with_fallback(
            ckpt_dir, last, meta, lambda s, _m: ckpt.restore_checkpoint(ckpt_dir, s, target), log)
        run = MapRun(state["params"], state["opt_state"], int(meta["step"]), list(meta["history"]),
                     jax.random.wrap_key_data(state["key"]), int(meta.get("below_tol", 0)))
        log.info("resuming from the checkpoint of step %d (saved on pdims %s, now %s)", run.step,
                 meta.get("pdims"), list(post.fwd.grid.pdims))
    if jax.process_index() == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(run_dir / "config.yaml", yaml.safe_dump(resolved, sort_keys=False))
        write_manifest(run_dir, COMMAND, resolved, obs)

    fwd = post.fwd
    pix_arcmin = fwd.geometry.pixel_size_arcmin
    log.info("MAP of %s%s and the %s field (%d latents) with %s, up to %d steps; %s forward, %s light cone",
             ", ".join(post.names) if theta_fixed is None else "nothing (cosmology fixed)",
             "" if theta_fixed is None else "", "x".join(map(str, fwd.grid.shape)), post.dim, mcfg.optimizer,
             mcfg.steps, fwd.kind, fwd.lightcone)
    t0 = time.perf_counter()
    if last is not None and (run.step >= mcfg.steps or converged(run, mcfg)):
        compiled = None  # run_map takes no step: a minute of compiling saved (tiny PM), more at scale
        log.info("the checkpoint of step %d is the fit's end: no optimiser step to compile or take", run.step)
    else:
        width0 = jnp.asarray(0.0, fwd.grid.jdtype)
        compiled = step_fn.lower(run.params, run.opt_state, data, width0).compile()
        release_freed_memory()
    barrier("fli-map-compiled")  # a peer compiling > 30 s longer would break the first step's gloo collective
    t_compile = time.perf_counter() - t0
    if compiled is not None:
        log.info("compiled the optimiser step in %.1f s", t_compile)

    names = post.names
    params_fn = jax.jit(lambda th: post.params(th))
    every = max(1, mcfg.steps // 50)

    def report(r: MapRun, info, dt):
        if r.step % every and r.step != 1 and r.step < mcfg.steps:
            return
        ph = {k: float(v) for k, v in params_fn(r.params.theta).items()}
        shown = " ".join(f"{k}={ph[k]:.4f}" for k in (*names, "S8") if k in ph)
        log.info("step %d/%d loss %.6g |grad| %.3g %s %.2f s/step, at most %s left (stage %d)", r.step, mcfg.steps,
                 float(info.loss), float(info.grad_norm), shown, dt, _left((mcfg.steps - r.step) * dt),
                 r.history[-1][4])

    predict = jax.jit(post.predict)  # the halo check at each checkpoint and finish() share its program

    def save(r: MapRun):
        meta = {"config": resolved, "step": r.step, "history": r.history, "below_tol": r.below_tol,
                "pdims": list(fwd.grid.pdims), "time": time.time()}
        ckpt.save_checkpoint(ckpt_dir, r.step, _state(r), meta)
        _write_history(run_dir, r)
        if r.step < mcfg.steps and not converged(r, mcfg):  # finish() checks the last point
            check_map_halo(predict(r.params)[1], fwd, cfg, f"at step {r.step} of {mcfg.steps} of the MAP",
                           f" (the fit stopped there, not at its end; the same command with a larger "
                           f"simulation.halo resumes it from step {r.step})")

    t_run = time.perf_counter()
    run = run_map(post, data, mcfg, run, compiled, opt, pixel_arcmin=pix_arcmin, log=log, on_checkpoint=save,
                  report=report)
    t_run = time.perf_counter() - t_run
    if not run.history:
        raise ConfigError(f"inference.map.steps = {mcfg.steps} is not more than the {run.step} steps already done "
                          f"in {run_dir}: raise it to continue")
    return finish(cfg, run_dir, obs, post, data, run, theta_fixed, log, est, t_compile=t_compile, t_run=t_run,
                  predict=predict)


def check_map_halo(aux, fwd, cfg: Config, where: str, after: str = "") -> float:
    """The largest displacement of a forward's ``aux`` against ``simulation.halo`` (its
    ``on_overflow`` policy); raises ConfigError naming ``where`` on an overflow."""
    from fli.sim.painting import check_halo  # noqa: PLC0415

    max_disp = float(np.max(np.asarray(aux.max_disp)))
    try:
        check_halo(max_disp, fwd.grid.halo, cfg.simulation.on_overflow, fwd.grid.assignment)
    except ValueError as e:
        raise ConfigError(f"simulation.halo: {where} {e}{after}") from None
    return max_disp


def load_map_field(run_dir, mesh=None, name: str = FIELD_NAME):
    """The MAP white noise of a fli-map run (``name``: the joint MAP's, or MUSE's field at its
    estimate), sharded ``P('x','y')`` over ``mesh`` (each process reading its blocks) or numpy
    without one."""
    import zarr  # noqa: PLC0415

    from fli.store.io import read_array  # noqa: PLC0415

    return read_array(zarr.open_group(str(Path(run_dir) / name), mode="r")["white_noise"], mesh)


def _write_history(run_dir: Path, run: MapRun) -> None:
    h = history_array(run)
    lines = ["step,loss,grad_norm,evals,seconds,stage"]
    lines += [f"{i + 1},{r[0]:.9g},{r[1]:.6g},{int(r[2])},{r[3]:.4f},{int(r[4])}" for i, r in enumerate(h)]
    write_text(run_dir / "loss_history.csv", "\n".join(lines) + "\n")


def finish(cfg: Config, run_dir: Path, obs, post: Posterior, data: Data, run: MapRun, theta_fixed, log,
           est: Estimator | None, *,
           t_compile: float, t_run: float, predict) -> dict:
    """Laplace errors, truth comparisons, outputs and figures of a finished optimisation;
    ``predict``: the jitted ``post.predict`` of the fit's halo checks."""
    from fli.infer.fit import figures  # noqa: PLC0415
    from fli.store.io import write_arrays  # noqa: PLC0415
    from fli.sim.sharding import process_allgather  # noqa: PLC0415

    mcfg, fwd = cfg.inference.map, post.fwd
    lat = run.params
    kappa, aux = predict(lat)
    max_disp = check_map_halo(aux, fwd, cfg, "at the MAP")
    u, paux = jax.jit(post.potential_and_aux)(lat, data)
    phys = {k: float(v) for k, v in jax.jit(post.params)(lat.theta).items()}
    hist = history_array(run)
    n_pix = int(np.sum(np.asarray(process_allgather(data.weight)) > 0))
    out = {
        "description": JOINT_MAP_NOTE if theta_fixed is None else
        "Field-only MAP: the white-noise field maximising p(s | d, theta) at the config's cosmology.",
        "kind": "joint" if theta_fixed is None else "field_only",
        "params": phys, "theta_latent": np.asarray(lat.theta).tolist(), "sampled": list(post.names),
        "loss": float(u), "chi2": float(paux["chi2"]), "n_pixels": n_pix,
        "chi2_per_pixel": float(paux["chi2"]) / max(n_pix, 1),
        **({} if "chi2_cut" not in paux else {  # the scale cut's own statistic (lensing.ell_max)
            "chi2_cut": float(paux["chi2_cut"]), "n_cut_components": int(paux["n_cut"]),
            "chi2_per_cut_component": float(paux["chi2_cut"]) / max(int(paux["n_cut"]), 1)}),
        "steps": run.step, "converged": converged(run, mcfg), "optimizer": mcfg.optimizer,
        "anneal": mcfg.anneal, "grad_evals": int(hist[:, 2].sum()), "time_s": {
            "compile": t_compile, "run_this_session": t_run, "steps_total": float(hist[:, 3].sum())},
        "max_disp_cells": max_disp, "forward": fwd.kind, "lightcone": fwd.lightcone,
        "pdims": list(fwd.grid.pdims), "processes": jax.process_count(),
    }
    if mcfg.laplace and theta_fixed is None and post.prior.n:
        key = laplace_key(run, mcfg)
        out["laplace"] = reusable_laplace(run_dir, key)
        if out["laplace"] is None:
            out["laplace"] = laplace_errors(post, data, lat, mcfg, log)
            write_json(run_dir / LAPLACE_JSON, {"key": key, "laplace": out["laplace"]}, default=float)
        else:
            log.info("Laplace: read back from %s, computed at this step (%d) and these settings by an earlier "
                     "start of this run", run_dir / LAPLACE_JSON, run.step)
    if obs.has_truth:
        out["truth"] = {k: float(obs.truth[k]) for k in (*post.names,) if k in obs.truth}
        tr = {k: float(v) for k, v in jax.jit(post.params)(jnp.asarray(post.theta_of(obs.truth))).items()}
        out["truth"].update({k: tr[k] for k in ("Omega_m", "S8")})
        out["error"] = {k: phys[k] - out["truth"][k] for k in out["truth"]}
    out["estimators"] = {"params": "joint MAP", "laplace": "Laplace approximation at the joint MAP",
                         "error": "joint MAP minus truth"}
    if est is not None:
        out[mcfg.estimator] = est.run(cfg, run_dir, post, data, log, out.get("truth"))
        out["estimators"][mcfg.estimator] = est.note
    # the field, each process writing its blocks
    write_arrays(run_dir / FIELD_NAME, {"white_noise": lat.s}, {"units": "unit Gaussian per cell",
                                                               "pdims": list(fwd.grid.pdims)})
    metrics = None
    compare = mcfg.compare_truth if mcfg.compare_truth is not None else obs.has_truth
    lin = None
    if obs.has_truth:  # the recovered and the true linear field, for the metrics and the figures
        lin = (linear_field_of(post, lat.theta, lat.s), truth_linear_field(post, obs))
    if compare:
        metrics = truth_metrics(post, lin, obs, kappa)
        write_json(run_dir / "metrics.json", metrics)
        out["recovery"] = {"k_r_half": {k: metrics["field"][k]["k_r_half"] for k in metrics["field"]},
                           "k_T_half": {k: metrics["field"][k]["k_T_half"] for k in metrics["field"]},
                           "ell_r_half": metrics["kappa"]["ell_r_half"]}
    out["figures"] = figures.map_figures(run_dir, post, obs, data, kappa, hist, metrics, lin)
    if est is not None and jax.process_index() == 0:
        out["figures"]["estimates"] = str(est.figure(out, run_dir / "estimates.png"))
    _write_history(run_dir, run)
    write_json(run_dir / MAP_JSON, out, default=float)
    barrier("fli-map-done")
    cut = f", chi2 per kept component {out['chi2_per_cut_component']:.3f}" if "chi2_cut" in out else ""
    log.info("MAP: %s; loss %.6g, chi2/pixel %.3f%s after %d steps (%s) -> %s",
             " ".join(f"{k}={v:.4f}" for k, v in phys.items()), out["loss"], out["chi2_per_pixel"], cut, run.step,
             "converged" if out["converged"] else "step budget", run_dir / MAP_JSON)
    return out


def laplace_key(run: MapRun, mcfg) -> dict:
    """What a Laplace block depends on within one run directory, whose model config a resumed
    start already matched (``check_resumable``): the point (the step and theta; the field is the
    same checkpoint's) and the settings that may change between starts."""
    return {"step": run.step, "theta_latent": np.asarray(run.params.theta).tolist(), "cg_tol": mcfg.cg_tol,
            "cg_maxiter": mcfg.cg_maxiter}


def reusable_laplace(run_dir: Path, key: dict) -> dict | None:
    """The Laplace block that ``run_dir/laplace.json`` holds for ``key``, else None (no file, a
    file cut short, another point or other settings). Process 0 decides for every process: the
    Laplace program is collective, so all compute it or none."""
    try:
        held = json.loads((Path(run_dir) / LAPLACE_JSON).read_text())
        found = held["laplace"] if held.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError):
        found = None
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils  # noqa: PLC0415

        if not bool(multihost_utils.broadcast_one_to_all(np.int32(found is not None))):
            return None
        found = found if found is not None else {"read_by": "process 0"}  # map.json is process 0's
    return found


def laplace_errors(post: Posterior, data: Data, lat: Latents, mcfg, log) -> dict:
    """Marginal (field marginalised, Schur complement by CG) and conditional Laplace errors
    of the sampled parameters at the MAP, in physical units (delta method)."""
    from fli.infer.fit.laplace import laplace, to_physical  # noqa: PLC0415

    # the observation is an argument, not a closure: its arrays span every process's devices
    U = lambda th, s, d: post.potential(Latents(th, s), d)
    res = lambda th, s, d: post.residual(Latents(th, s), d)
    t0 = time.perf_counter()
    lr = laplace(U, lat.theta, lat.s, residual=res, cg_tol=mcfg.cg_tol, cg_maxiter=mcfg.cg_maxiter, args=(data,))
    jac = np.asarray(post.prior.jacobian(lat.theta), float)
    cov_m, cov_c = to_physical(lr.cov_marginal, jac), to_physical(lr.cov_conditional, jac)
    names = list(post.names)
    sd = lambda c: {n: float(math.sqrt(c[i, i])) if c[i, i] > 0 else float("nan") for i, n in enumerate(names)}
    out = {"marginal": {"std": sd(cov_m), "cov": cov_m.tolist()},
           "conditional": {"std": sd(cov_c), "cov": cov_c.tolist()},
           "hessian": lr.hessian, "fallback_reason": lr.fallback_reason, "positive_definite": lr.positive_definite,
           "cg_iterations": np.asarray(lr.cg_iterations).tolist(), "cg_residual": np.asarray(lr.cg_residual).tolist(),
           "cg_converged": np.asarray(lr.cg_converged).tolist(), "n_hvp": lr.n_hvp,
           "cost_grad_evals": lr.cost_grad_evals, "seconds": time.perf_counter() - t0, "params": names,
           "units": "physical parameters (latent covariance mapped through the prior transform's Jacobian)"}
    log.info("Laplace (%s Hessian): marginal std %s; conditional %s; CG iterations %s, %d HVPs",
             lr.hessian, {k: round(v, 5) for k, v in out["marginal"]["std"].items()},
             {k: round(v, 5) for k, v in out["conditional"]["std"].items()}, out["cg_iterations"], lr.n_hvp)
    return out


def truth_metrics(post: Posterior, lin, obs, kappa) -> dict:
    """r(k), T(k) of the recovered linear field and r_ell of the recovered kappa against the
    mock's truth; ``lin``: the recovered and the true linear field."""
    from fli.infer.fit.metrics import field_metrics, kappa_metrics  # noqa: PLC0415

    rec, tru = lin
    return {"field": field_metrics(post.fwd, rec, tru),
            "kappa": kappa_metrics(kappa, obs.kappa_true, post.fwd.geometry.fov_deg)}
