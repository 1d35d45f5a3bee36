"""The run loop of a sampling run (``fli-sample``; ``fli-nuts`` for NumPyro's kernels): chains in
chunks, outputs and checkpoints after each, resumable and extendable.

Every process runs the same code and the same jitted programs; process 0 writes the small
files, each process its own blocks of the fields. The loop: read the observation and build the
posterior; start the chains (:mod:`fli.infer.sample.start`) or restore them from the last checkpoint
(on another device layout through :mod:`fli.infer.sample.relayout`); then, per chunk, run the chunk
program (:mod:`fli.infer.sample.chunk`), write the chunk and the running statistics
(:mod:`fli.infer.sample.run_store`), save the checkpoint, mark the chunk complete, rewrite
``posterior.nc`` (:mod:`fli.infer.sample.inference_data`) and log one progress line. ``nuts.json``
is written last. On the same layout the resumed chain is the uninterrupted one, bit for bit.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import yaml
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fli.config import Config
from fli.store.files import barrier, write_json
from fli.infer.checkpoint import store as ckpt
from fli.infer.sample.chunk import Accum, Draws, accum_of_chain, make_chunk, take_chain, zero_accum
from fli.infer.config_keys import SAMPLING_MAY_CHANGE, check_resumable
from fli.infer.sample.inference_data import kappa_summary, write_combined_inference_data, write_inference_data
from fli.infer.sample.kernels import make_kernel
from fli.infer.posterior.layout import FLAT_SPEC
from fli.infer.fit.map import check_map_halo
from fli.infer.posterior.model import Posterior
from fli.infer.posterior.params import reported_names
from fli.infer.sample.precondition import Preconditioned, linearised_start, preconditioner_of
from fli.infer.sample.projections import projector_of
from fli.infer.sample.run_store import (
    CHECKPOINTS,
    NUTS_JSON,
    chain_dir,
    complete_chunks,
    count_post_divergences,
    mark_chunk,
    read_chunks,
    tidy_chunks,
    write_chunk,
    write_config,
    write_running,
)
from fli.infer.sample.base import Kernel
from fli.infer.sample.start import (
    chain_keys,
    check_init_map,
    check_init_theta,
    initial_point,
    start_theta,
    warn_prior_start,
)
from fli.lensing.born import KAPPA_SPEC
from fli.store.manifest import check_kind, check_same_observation, read_manifest, write_manifest
from fli.sim.power import default_kedges
from fli.sim.sharding import replicated_to_host

# the field names of Accum in checkpoints written before they were renamed
_LEGACY_ACCUM = {"mean_k": "mean_kappa", "m2_k": "m2_kappa"}


def kernel_of(cfg: Config, post: Posterior) -> Kernel:
    """The kernel of a run's ``inference`` config."""
    i = cfg.inference
    return make_kernel(post, i.sampler, kernel=i.kernel, num_warmup=i.num_warmup, target_accept=i.target_accept,
                       max_tree_depth=i.max_tree_depth, num_steps=i.num_steps, step_size=i.step_size,
                       integrator=i.integrator, mclmc_length=i.mclmc_length, precondition=i.precondition,
                       mclmc_energy_error=i.mclmc_energy_error)


def _state(kstate, acc: Accum) -> dict:
    return {"kernel": kstate, "acc": acc}


def _last_checkpoint(ckpt_dir: Path, resolved: dict, run_dir: Path, log) -> tuple[int | None, dict | None]:
    """The newest readable checkpoint's step and meta, after checking that this run may
    continue it (every process asks: a collective)."""
    last, meta = ckpt.newest_readable(ckpt_dir, log)
    if last is None:
        return None, None
    # runs made before inference.sampler existed all sampled the flat, sharded latent
    meta["config"].setdefault("inference", {}).setdefault("sampler", "sharded")
    check_resumable(meta["config"], resolved, SAMPLING_MAY_CHANGE, where=f"run_dir {run_dir}")
    return last, meta


def _restore(ckpt_dir: Path, last: int, meta: dict, ktemplate, post: Posterior, kernel: Kernel, n_chains: int):
    """The kernel state and running statistics of checkpoint ``last``, on this device layout."""
    acc_t = zero_accum(post, n_chains)
    saved_paths = {rec["path"] for rec in ckpt.read_leaves(ckpt_dir, last)}
    legacy = any(f"['acc'].{old}" in saved_paths for old in _LEGACY_ACCUM)
    if legacy:  # a checkpoint of an older fli: Accum's fields under their former names
        acc_t = _legacy_accum(acc_t)
    template = _state(ktemplate, acc_t)
    if list(meta["pdims"]) != list(post.fwd.grid.pdims) and kernel.layout_dependent:
        from fli.infer.sample.relayout import restore_on_new_layout  # noqa: PLC0415

        state = restore_on_new_layout(ckpt_dir, last, template, meta, post)
    else:
        state, _ = ckpt.restore_checkpoint(ckpt_dir, last, template)
    return state["kernel"], Accum(*state["acc"])


def _legacy_accum(acc: Accum):
    from collections import namedtuple  # noqa: PLC0415

    names = [next((o for o, n in _LEGACY_ACCUM.items() if n == f), f) for f in Accum._fields]
    return namedtuple("Accum", names)(*acc)


def run_chains(cfg: Config, resolved: dict, run_dir: Path, log: logging.Logger, command: str = "fli-sample") -> dict:
    """Sample (or resume) the run's chains into ``run_dir``; returns the content of ``nuts.json``.
    ``command``, the one the user ran (``fli-sample`` or ``fli-nuts``), goes in the manifest."""
    from fli.infer.posterior.setup import prepare  # noqa: PLC0415

    run_dir = Path(run_dir)
    check_kind(run_dir, command)
    icfg = cfg.inference
    n_chains = icfg.chains_per_run
    obs, post, data = prepare(cfg, log, compare_truth=False)
    total = icfg.num_warmup + icfg.num_samples
    ckpt_dir = run_dir / CHECKPOINTS
    last, meta = _last_checkpoint(ckpt_dir, resolved, run_dir, log)
    if meta is not None:
        recorded = (read_manifest(run_dir) or {}).get("observation")
        check_same_observation(recorded, obs, f"run_dir {run_dir}", legacy_path=meta["config"].get("mock"))
    if meta is not None and (run_dir / NUTS_JSON).exists() and meta["draws"] >= total:
        # a sweep started again after a crash passes over its finished jobs: nothing is rewritten
        log.info("run_dir %s already holds a finished run of %d draws (%s): nothing to do; raise "
                 "inference.num_samples to extend it", run_dir, meta["draws"], NUTS_JSON)
        return json.loads((run_dir / NUTS_JSON).read_text())
    grid, lay = post.fwd.grid, post.layout
    chain_dirs = [chain_dir(run_dir, c, n_chains) for c in range(n_chains)]
    kernel = kernel_of(cfg, post)
    k_inits, k_kernels = chain_keys(cfg.seed, n_chains)
    zsh = NamedSharding(grid.mesh, P(None, *FLAT_SPEC))
    t0 = time.perf_counter()
    pre_info = None
    if icfg.precondition != "none":  # the kernels read the data with the preconditioner beside it
        pre, pre_info = preconditioner_of(cfg, post, obs, data, run_dir, last is None, log)
        data = Preconditioned(data, pre)
    proj, proj_info = projector_of(cfg, post, obs, data.data if pre_info is not None else data, run_dir,
                                   last is None, pre if pre_info is not None else None, log)
    if last is None:
        if pre_info is not None:
            check_init_theta(cfg)
            mj = check_init_map(cfg, Path(cfg.init), obs)
            theta_of = lambda k: start_theta(icfg.init_theta, mj, cfg.init, post, k, "prior")[::2]
            starts = [linearised_start(post, pre, k, theta_of) for k in k_inits]
            init_desc = {"init": str(cfg.init), **starts[0][1]}
            log.info("start: y ~ N(0, I) in the preconditioned latent (the linearised posterior around the MAP of "
                     "%s), theta from %s", cfg.init, init_desc["theta"])
        else:
            warn_prior_start(cfg, post, log)
            starts = [initial_point(cfg, post, obs, k, log) for k in k_inits]
            init_desc = starts[0][1]
        z0 = jax.jit(lambda *zs: jnp.stack(zs), out_shardings=zsh)(*[z for z, _ in starts])
        del starts
        kstate = kernel.init(z0, k_kernels, data)
        acc = zero_accum(post, n_chains)
        acc = acc._replace(grads=acc.grads + 1)
        done, seconds0, chunk0 = 0, 0.0, 0
    else:
        z0 = jax.ShapeDtypeStruct((n_chains, lay.size), grid.jdtype, sharding=zsh)
        ktemplate = kernel.template(z0, k_kernels, data)
        (kstate, acc), last, meta = ckpt.restore_with_fallback(
            ckpt_dir, last, meta, lambda s, m: _restore(ckpt_dir, s, m, ktemplate, post, kernel, n_chains), log)
        done, seconds0, chunk0, init_desc = int(meta["draws"]), float(meta["seconds"]), last + 1, meta["init"]
        log.info("resuming after chunk %d (%d draws done; saved on pdims %s, now %s)", last, done, meta["pdims"],
                 list(grid.pdims))
    for d in chain_dirs:
        tidy_chunks(d, last, log)
    for d in dict.fromkeys([run_dir, *chain_dirs]):  # the run is valid: say what it is
        write_config(d, resolved)
        write_manifest(d, command, resolved, obs)
    if done >= total:
        log.info("nothing to do: %d draws done of %d", done, total)
    kedges = default_kedges(grid.fft, grid.box)
    k_centres = 0.5 * (kedges[1:] + kedges[:-1])
    grid_info = {"shape": list(grid.shape), "box": list(grid.box), "pdims": list(grid.pdims)}
    names = post.names
    programs: dict[int, object] = {}
    log.info("%s on %d latents (%s field, %s, %d warm-up + %d draws in chunks of %d; %s forward, %s light cone%s); "
             "start: %s", icfg.kernel.upper(), post.dim, "x".join(map(str, grid.shape)),
             ", ".join(names) or "fixed cosmology", icfg.num_warmup, icfg.num_samples, icfg.chunk, post.fwd.kind,
             post.fwd.lightcone,
             f"; {n_chains} vectorised chains" if n_chains > 1 else "",
             init_desc.get("init") if isinstance(init_desc, dict) else init_desc)
    observed = {"noise_sigma": np.asarray(obs.noise_sigma, np.float64).reshape(-1),
                **kappa_summary(obs)}  # a collective where the map is sharded over processes
    attrs = {"config": yaml.safe_dump(resolved, sort_keys=False), "pdims": list(grid.pdims),
             "layout": ("flat P(('x','y')), per-device [field block | tail]" if icfg.sampler == "sharded"
                        else "NumPyro's ravel of (theta, field)"), "kernel": icfg.kernel, "sampler": icfg.sampler,
             "energy_offset": post.energy_offset + 0.5 * kernel.dim, "init": init_desc}
    i = chunk0
    t_start = time.perf_counter()
    n_div_post = sum(count_post_divergences(d) for d in chain_dirs)
    s_spec, k_spec = P(None, *grid.sharding.spec), P(None, *KAPPA_SPEC)
    while done < total:
        n = min(icfg.chunk, total - done)
        if n not in programs:
            tc = time.perf_counter()
            prog = make_chunk(kernel, post, n, icfg.field_thin, icfg.num_warmup, kedges)
            programs[n] = prog.lower(kstate, acc, data, proj).compile()
            log.info("compiled the %d-draw chunk program in %.1f s", n, time.perf_counter() - tc)
        barrier("fli-nuts-chunk-start")  # enter the chunk's collectives together (gloo gives up after 30 s)
        tc = time.perf_counter()
        kstate, acc, draws, fields = programs[n](kstate, acc, data, proj)
        jax.block_until_ready(kstate)
        dt = time.perf_counter() - tc
        seconds = seconds0 + dt * (np.arange(1, n + 1) / n)
        host = jax.tree.map(replicated_to_host, draws)  # replicated per-draw scalars [n, chains]
        # particles beyond the halo were painted in the wrong cells: stop before this chunk is kept
        check_map_halo(host, post.fwd, cfg, f"in draws {done + 1}-{done + n} of the chain(s)",
                       f" (the run stopped before keeping them; the same command with a larger simulation.halo "
                       f"resumes it after draw {done})")
        for c, d in enumerate(chain_dirs):
            f_c = None if fields is None else (take_chain(fields[0], c, 1, s_spec), take_chain(fields[1], c, 1, k_spec))
            write_chunk(d, i, done, icfg.num_warmup, jax.tree.map(lambda x, c=c: x[:, c], host), f_c,
                        icfg.field_thin, k_centres, seconds, grid_info)
            write_running(d, accum_of_chain(acc, c, grid), grid_info)
        done += n
        seconds0 += dt
        meta = {"config": resolved, "draws": done, "chunk": i, "pdims": list(grid.pdims), "seconds": seconds0,
                "init": init_desc, "time": time.time(), "layout_size": lay.size, "n_params": post.prior.n,
                "chains": n_chains}
        ckpt.save_checkpoint(ckpt_dir, i, _state(kstate, acc), meta)
        for d in chain_dirs:
            mark_chunk(d, i)
        for d in chain_dirs:
            write_inference_data(d, names, observed, {**attrs, "seconds": seconds0})
        if n_chains > 1:
            write_combined_inference_data(run_dir, chain_dirs)
        post_mask = np.arange(done - n, done) >= icfg.num_warmup
        n_div_post += int(np.sum(np.asarray(host.info.diverging)[post_mask]))
        _progress(log, icfg, done, total, host, acc, dt / n, n_div_post, time.perf_counter() - t_start, i, chunk0,
                  bool(names))
        i += 1
    summaries = [_summary(d, icfg, post, seconds0, init_desc, time.perf_counter() - t0) for d in chain_dirs]
    if n_chains == 1:
        summary = summaries[0]
    else:
        for d, sm in zip(chain_dirs, summaries, strict=True):
            write_json(d / NUTS_JSON, sm)
        summary = _combined_summary(summaries, chain_dirs)
    if pre_info is not None:  # its gradients are counted apart from the chains' (gradient_evals)
        lam = pre_info["eigenvalues"]
        summary["preconditioner"] = {**{k: pre_info.get(k) for k in ("kind", "rank", "points", "grad_evals", "seconds",
                                                                     "point")},
                                     "eigenvalue_largest": lam[0], "eigenvalue_smallest_kept": lam[-1]}
    if proj_info is not None:  # its gradients, if it built its own, are counted apart from the chains'
        summary["projections"] = {k: proj_info.get(k) for k in ("source", "count", "grad_evals", "seconds", "point",
                                                              "eigenvalues")}
    write_json(run_dir / NUTS_JSON, summary)
    log.info("done: %d chain(s) of %d draws (%d after warm-up), %d divergences after warm-up, %d gradient "
             "evaluations, %.1f s sampling; %s", n_chains, summaries[0]["draws"], summaries[0]["draws_post_warmup"],
             sum(sm["divergences_post_warmup"] for sm in summaries), sum(sm["gradient_evals"] for sm in summaries),
             seconds0, run_dir)
    return summary


def _combined_summary(summaries: list[dict], chain_dirs: list[Path]) -> dict:
    s0 = summaries[0]
    out = {k: s0[k] for k in ("kernel", "draws", "draws_post_warmup", "num_warmup", "chunks", "seconds_sampling",
                              "seconds_this_run", "init", "dim", "pdims", "energy_note", "warmup_note")}
    out.update(chains_per_run=len(summaries),
               divergences_post_warmup=sum(s["divergences_post_warmup"] for s in summaries),
               gradient_evals=sum(s["gradient_evals"] for s in summaries),
               chains={d.name: {k: s[k] for k in ("divergences_post_warmup", "gradient_evals", "step_size",
                                                  "mean_tree_depth", "params_mean")}
                       for d, s in zip(chain_dirs, summaries, strict=True)},
               vectorised_note="the chains advance together in one program: a draw of all of them takes as long as "
                               "the deepest tree among them, so seconds_sampling is the run's, not per chain")
    return out


def _progress(log, icfg, done, total, draws: Draws, acc: Accum, per_draw, n_div, elapsed, i, chunk0,
              sampled: bool = True) -> None:
    """One line per chunk (rank 0); ``draws`` on the host, ``[n, chains]``; with several
    chains the step size is each chain's and the rest is over all of them. A chain whose
    parameters did not move is warned of where any is ``sampled`` (at fixed cosmology none moves)."""
    info = draws.info
    warm = min(done, icfg.num_warmup)
    left = (total - done) * per_draw
    steps = np.atleast_1d(np.asarray(info.step_size)[-1])
    if icfg.kernel == "mclmc":  # no tree, no acceptance: the energy error is what its step size is tuned by
        err = np.asarray(info.energy_error, float)
        what = (f"energy error variance per dimension {np.nanmean(err ** 2):.2g} (tuned to "
                f"{icfg.mclmc_energy_error:g} in the warm-up)"
                if np.isfinite(err).any() else "energy error n/a")
    elif icfg.kernel == "adjusted_mclmc":
        what = (f"accept {float(np.mean(info.accept_prob)):.2f}, "
                f"{float(np.mean(info.num_steps)):.0f} gradients a transition")
    else:
        capped = (np.asarray(info.tree_depth) >= icfg.max_tree_depth) & (np.asarray(info.turning) == 0) \
            & ~np.asarray(info.diverging, bool)
        what = (f"tree depth {float(np.mean(info.tree_depth)):.1f} (max {int(np.max(info.tree_depth))}"
                + (f", {100 * float(np.mean(capped)):.0f}% cut by the cap" if icfg.kernel == "nuts" else "")
                + f"), accept {float(np.mean(info.accept_prob)):.2f}")
    params = {k: np.asarray(v, np.float64).reshape(len(np.asarray(v)), -1) for k, v in sorted(draws.params.items())}
    log.info("chunk %d: draws %d/%d (warm-up %d/%d), %s; step size %s, %s, divergences after warm-up %d, gradient "
             "evaluations %d, %.2f s/draw, %s left", i, done, total, warm, icfg.num_warmup,
             ", ".join(f"{k} " + " ".join(f"{x:.4g}" for x in v[-1]) for k, v in params.items()),
             " ".join(f"{x:.3g}" for x in steps), what, n_div, int(np.sum(replicated_to_host(acc.grads))), per_draw,
             _fmt_time(left))
    for c in range(next(iter(params.values())).shape[1] if params and sampled else 0):
        still = [f"{k} = {v[0, c]:.4g}" for k, v in params.items() if v.shape[0] > 1 and np.ptp(v[:, c]) == 0]
        if still:  # e.g. MCLMC from the prior on the default size: theta ran to its prior's edges (docs/benchmarks.md)
            log.warning("chain %d did not move in chunk %d (%s): stuck, at a prior's edge if the value is one "
                        "(docs/nuts.md, Start: large fields)", c, i, ", ".join(still))


def _fmt_time(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


WARMUP_NOTES = {  # what each kernel tunes over its warm-up, for nuts.json
    "nuts": "NumPyro's windowed adaptation of the step size and the diagonal mass matrix runs over it",
    "hmc": "NumPyro's windowed adaptation of the step size and the diagonal mass matrix runs over it",
    "mclmc": "MCLMC's step size (from the energy error) and trajectory length L (from the second half's "
             "variances) are tuned over it, fli/infer/sample/mclmc.py",
    "adjusted_mclmc": "the step size (dual averaging to inference.target_accept) and L (from the second half's "
                      "variances) are tuned over it, fli/infer/sample/adjusted_mclmc.py",
}


def _summary(run_dir: Path, icfg, post: Posterior, seconds: float, init_desc, wall: float) -> dict:
    c = read_chunks(run_dir)
    warm = c["draws"]["warmup"].astype(bool)
    st = c["stats"]
    return {
        "kernel": icfg.kernel, "sampler": icfg.sampler, "draws": int(warm.size),
        "draws_post_warmup": int((~warm).sum()),
        "num_warmup": icfg.num_warmup, "chunks": len(complete_chunks(run_dir)),
        "divergences_post_warmup": int(st["diverging"][~warm].sum()),
        "gradient_evals": int(st["gradient_evals"][-1]), "seconds_sampling": seconds, "seconds_this_run": wall,
        "step_size": float(st["step_size"][-1]), "mean_tree_depth": float(np.mean(st["tree_depth"][~warm]))
        if (~warm).any() and icfg.kernel == "nuts" else None,
        # NUTS: the post-warm-up draws whose tree the depth cap ended (no U-turn; NaN records are older draws')
        "depth_cap_fraction": float(np.mean((st["tree_depth"][~warm] >= icfg.max_tree_depth)
                                            & (st["turning"][~warm] == 0) & ~st["diverging"][~warm].astype(bool)))
        if (~warm).any() and icfg.kernel == "nuts" and "turning" in st else None,
        "energy_error_var_per_dim": float(np.nanmean(st["energy_error"][~warm] ** 2))
        if (~warm).any() and icfg.kernel == "mclmc" else None,
        "params_mean": {k: float(np.mean(c["draws"][k][~warm])) for k in reported_names(post.names)}
        if (~warm).any() else None,
        "init": init_desc, "dim": post.dim, "pdims": list(post.fwd.grid.pdims),
        "energy_note": "energies are H minus a constant offset (attrs.energy_offset of posterior.nc): "
                       "float64 sums of float32 fields, see fli/infer/posterior/energy.py",
        "warmup_note": "num_warmup from inference.num_warmup; " + WARMUP_NOTES[icfg.kernel],
    }

