#!/usr/bin/env python
"""What the model's missing small scales do to S8: paired mocks, analysed with and without the scale cut.

Issue 22, part 4. For pair ``i`` two observations share their initial conditions and their shape
noise:

* **model**: the analysis config's own forward on the white noise of ``seed=i``;
* **finer**: the same config with ``--finer`` overrides (for example 2x the mesh, more planes,
  particle planes with the shift) on that white noise refined onto its grid
  (:func:`fli.sim.refine.refine_white_noise`: the coarse grid's modes kept, finer ones fresh).

Both carry the same noise map (``fli.mock.add_shape_noise(i, ...)``; same key, same pixels), so
their difference is the two forwards' difference alone. Each is written as an observation
(``observation.zarr``, no white noise: the analysis sees data only) and analysed with the analysis
config, once reading every pixel and once with ``lensing.ell_max`` (``--ell-max``). The shift of
S8 between the pair, over the model mock's sd, is reported for each; issue 22's goal is under
0.5 with the cut. ``--estimator`` picks the analysis:

* ``muse`` (``fli-map inference.map.estimator=muse``): the model mock's all-pixel analysis starts
  from the prior's median, the other three from its estimate; the sd is MUSE's.
* ``mclmc`` (``fli-map inference.map.laplace=false``, then ``fli-sample inference.kernel=mclmc
  init=<that MAP>``, then ``fli-diagnose``): the posterior's mean and sd of S8 from the chains,
  with the mean's Monte Carlo error. The chains start from the joint MAP's field (from the
  prior, a field that fits nothing sends them to the prior's edges; docs/benchmarks.md). The
  chains' length comes with the overrides (``inference.num_samples`` ...).

Each command runs niced on one core (``--core``); two drivers share a study: one makes a pair's
mocks (``claim_<i>``), and each analysis goes to the first driver that claims it
(``claim_<i>_<mock>_<cut>``), so two drivers can finish one pair.
Resumable: finished steps are passed over, and ``--keep DIR`` copies each finished analysis's
record (MUSE's map.json, or the chains' ``model_error.json``) to ``DIR/pair_<i>_<mock>_<cut>.json``
(committed), which count as finished; a study keeps one estimator's records per ``DIR``. ``--mocks-only``
makes the observations and stops.

    nice -n 19 python -m scripts.studies.model_error --out /tmp/me --pairs 4 --ell-max 300,600 \\
        --keep docs/bench/model_error_tiny \\
        --finer "simulation.mesh=[32,32,128] simulation.halo=6 lensing.n_planes=16" -- \\
        experiment=tiny survey.sigma_e=0.05 inference.map.muse.n_sims=16 inference.map.muse.map_steps=300

    nice -n 19 python -m scripts.studies.model_error --estimator mclmc --out /tmp/me_mclmc --pairs 4 --ell-max 300,600 \\
        --keep docs/bench/model_error_tiny_mclmc \\
        --finer "simulation.mesh=[32,32,128] simulation.halo=6 lensing.n_planes=16" -- \\
        experiment=tiny survey.sigma_e=0.05 inference.num_warmup=400 inference.num_samples=2000 \\
        inference.chains_per_run=4 inference.chunk=200 inference.field_thin=200
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
from scripts.studies.study import claim, emit, keep_record, run_logged  # noqa: E402

MOCKS = ("model", "finer")
ESTIMATORS = ("muse", "mclmc")
RECORD = {"muse": "map.json", "mclmc": "model_error.json"}  # a finished analysis's record in its run directory
PARAMS = ("Omega_c", "sigma8", "S8")
REFINE_SEED = 1_000_000  # the finer grid's fresh modes of pair i: numpy seed REFINE_SEED + i


def make_pair(out: Path, i: int, overrides: list[str], finer: list[str]) -> dict:
    """Write ``out/pair_<i>/{model,finer}/observation.zarr`` and ``noiseless.npz`` (the two
    noiseless maps); returns what was made. One process, the default device mesh."""
    import jax  # noqa: PLC0415

    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.config import ConfigError  # noqa: PLC0415
    from fli.forward import build_forward, fiducial_cosmology  # noqa: PLC0415
    from fli.store.io import write_observation  # noqa: PLC0415
    from fli.mock import add_shape_noise  # noqa: PLC0415
    from fli.sim.painting import check_halo  # noqa: PLC0415
    from fli.sim.refine import refine_white_noise  # noqa: PLC0415
    from fli.sim.sharding import make_mesh, white_noise  # noqa: PLC0415
    from fli.lensing.survey import load_mask, noise_sigma  # noqa: PLC0415

    pair = out / f"pair_{i:03d}"
    cfgs = {m: compose([*overrides, *(finer if m == "finer" else []), f"seed={i}"]) for m in MOCKS}
    s_model = None
    made = {}
    for m in MOCKS:
        cfg, resolved = cfgs[m]
        fwd = build_forward(cfg, mesh=make_mesh(cfg.distributed.pdims))
        grid = fwd.grid
        if m == "model":
            s = white_noise(i, grid.shape, grid.mesh, dtype=grid.jdtype)
            s_model = np.asarray(jax.device_get(s), np.float64)
        else:
            host = refine_white_noise(s_model, grid.shape, np.random.default_rng(REFINE_SEED + i)).astype(grid.dtype)
            s = jax.make_array_from_callback(host.shape, grid.sharding, lambda idx, h=host: h[idx])
        kappa, aux = jax.jit(lambda c, x, f=fwd: f(c, x))(fiducial_cosmology(cfg), s)
        max_disp = float(np.max(np.asarray(aux.max_disp)))
        try:
            check_halo(max_disp, grid.halo, "raise", grid.assignment)
        except ValueError as e:
            raise ConfigError(f"{m} mock of pair {i}: simulation.halo: {e}") from None
        sigma = noise_sigma(cfg.survey, cfg.lensing.fov_deg, cfg.lensing.npix)
        mask = load_mask(cfg.survey, cfg.lensing.npix)
        noisy = add_shape_noise(i, kappa, sigma, mask)
        path = pair / m / "observation.zarr"
        shutil.rmtree(path.parent, ignore_errors=True)
        write_observation(path, np.asarray(noisy.kappa), sigma, np.stack([np.asarray(b.z) for b in fwd.bins]),
                          np.stack([np.asarray(b.nz) for b in fwd.bins]), cfg.lensing.fov_deg, mask,
                          attrs={"truth": cfg.cosmology.parameters(), "made_by": f"scripts/studies/model_error.py {m}",
                                 "config": resolved, "seed": i})
        made[m] = {"kappa_true": np.asarray(kappa), "mesh": list(grid.shape), "max_disp": max_disp}
    np.savez(pair / "noiseless.npz", **{m: made[m]["kappa_true"] for m in MOCKS})
    return made


def check_finer(overrides: list[str], finer: list[str], ell_max: str) -> None:
    """ConfigError (one line) unless both configs and the cut compose, and the finer one keeps
    the analysis's cosmology, map and survey (only the simulation may differ)."""
    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.config import ConfigError  # noqa: PLC0415

    a, _ = compose(overrides)
    b, _ = compose([*overrides, *finer])
    compose([*overrides, f"lensing.ell_max=[{ell_max}]"])
    for what in ("cosmology", "survey", "lensing.fov_deg", "lensing.npix"):
        get = lambda c, w=what: functools.reduce(getattr, w.split("."), c)
        if get(a) != get(b):
            raise ConfigError(f"--finer changes {what}: the finer simulation must keep the analysis's cosmology, "
                              f"survey, lensing.fov_deg and lensing.npix (only how the universe is simulated differs)")


def _record(out: Path, keep: Path | None, i: int, mock: str, cut: str, estimator: str = "muse") -> Path | None:
    """The finished analysis's record: the study directory's, else the kept copy, else None."""
    run = out / f"pair_{i:03d}" / f"{mock}_{cut}" / RECORD[estimator]
    kept = keep / f"pair_{i:03d}_{mock}_{cut}.json" if keep else None
    return run if run.exists() else (kept if kept is not None and kept.exists() else None)


def _start(out: Path, keep: Path | None, i: int, mock: str, cut: str) -> list[str]:
    """Where an analysis's Newton iteration starts: the model mock's all-pixel analysis from the
    prior's median, the pair's three others from its estimate (``inference.map.muse.start``).
    The estimate is the root of MUSE's score, wherever the iteration starts; the pair's
    estimates lie close, so the three converge in fewer iterations, each needing fewer H's."""
    if (mock, cut) == ("model", "all"):
        return []
    rec = _record(out, keep, i, "model", "all")
    if rec is None:
        return []
    muse = json.loads(rec.read_text())["muse"]
    z = muse.get("theta_root_z") or muse["theta_z"]  # the root (records before it was kept: theta_z was the root)
    return [f"inference.map.muse.start=[{','.join(f'{v:.6f}' for v in z)}]"]


def chain_record(run: Path, start: Path, log: Path, core: int) -> dict:
    """fli-diagnose of a finished fli-sample run; ``run/model_error.json`` (written whole, then
    renamed) with each parameter's posterior mean, sd, Monte Carlo error of the mean, R-hat and
    ESS, the verdict, and the gradient evaluations of the start's MAP (``start``), the warm-up
    and the draws."""
    diag = run / "diagnose"
    if diag.exists():
        shutil.rmtree(diag)
    # fli-diagnose's warn (3) and fail (4) come with their report: the record keeps the verdict
    run_logged(["fli.cli.diagnose", f"runs=[{run}]", f"run_dir={diag}", "diagnose.figures=false"], log, core,
               ok=(0, 3, 4))
    rep = json.loads((diag / "diagnostics.json").read_text())
    start_map = json.loads((start / "map.json").read_text())
    nuts = json.loads((run / "nuts.json").read_text())
    total = nuts["gradient_evals"]
    rec = {"estimator": "mclmc", "verdict": rep["verdict"], "chains": rep["chains"],
           "draws_per_chain": rep["draws_per_chain"], "post_warmup_gradient_evals": rep["efficiency"]["gradient_evals"],
           "warmup_gradient_evals": total - rep["efficiency"]["gradient_evals"],
           "seconds_sampling": nuts["seconds_sampling"], "start": {"joint_map": start_map["params"],
                                                   "gradient_evals": start_map["grad_evals"],
                                                   "seconds": start_map["time_s"]},
           "params": {k: {f: rep["params"][k][f] for f in ("mean", "sd", "mcse_mean", "rhat", "ess_bulk", "ess_tail")}
                      for k in PARAMS}}
    tmp = run / f".{RECORD['mclmc']}.tmp"
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.rename(run / RECORD["mclmc"])
    return rec


def analyse(out: Path, pairs: int, overrides: list[str], finer: list[str], ell_max: str, core: int,
            keep: Path | None, mocks_only: bool, estimator: str = "muse") -> None:
    cuts = {"all": [], "cut": [f"lensing.ell_max=[{ell_max}]"]}
    for i in range(pairs):
        pair = out / f"pair_{i:03d}"
        if all(_record(out, keep, i, m, c, estimator) for m in MOCKS for c in cuts):
            continue
        if not all((pair / m / "observation.zarr" / "COMPLETE").exists() for m in MOCKS):
            if not claim(out, i):  # another driver is making them
                continue
            pair.mkdir(parents=True, exist_ok=True)
            make_pair(out, i, overrides, finer)
        if mocks_only:
            continue
        for m in MOCKS:
            for c, extra in cuts.items():
                name = f"pair_{i:03d}_{m}_{c}"
                if _record(out, keep, i, m, c, estimator) or not claim(out, name[5:]):
                    continue
                run, log, t0 = pair / f"{m}_{c}", out / f"{name}.log", time.time()
                if estimator == "mclmc":  # the chains start from the joint MAP's field, fitted under the same cut
                    start = pair / f"{m}_{c}_map"
                    if not (start / "map.json").exists():
                        run_logged(["fli.cli.map", *overrides, *extra, f"mock={pair / m}", f"run_dir={start}",
                                    "inference.map.laplace=false"], log, core)
                    cmd, own = "fli.cli.sample", ["inference.kernel=mclmc", f"init={start}"]
                else:
                    cmd, own = "fli.cli.map", ["inference.map.estimator=muse", *_start(out, keep, i, m, c)]
                run_logged([cmd, *overrides, *extra, *own, f"mock={pair / m}", f"run_dir={run}"], log, core)
                if estimator == "mclmc":
                    chain_record(run, start, log, core)
                if keep is not None:
                    keep_record(run / RECORD[estimator], keep / f"{name}.json")
                print(f"[{time.strftime('%H:%M:%S')}] {name}: {time.time() - t0:.0f} s", flush=True)


def s8_of(record: dict) -> dict:
    """S8 of a finished analysis's record, either estimator's: its value, sd, Monte Carlo sd and
    whether the analysis converged (MUSE's Newton iteration; the chains' R-hat of S8 below 1.01)."""
    if record.get("estimator") == "mclmc":
        p = record["params"]["S8"]
        return {"S8": p["mean"], "sd": p["sd"], "mc_sd": p["mcse_mean"], "converged": p["rhat"] < 1.01}
    m = record["muse"]
    return {"S8": m["params"]["S8"], "sd": m["sd"]["S8"], "mc_sd": m["mc_sd"]["S8"], "converged": m["converged"]}


def report(out: Path, pairs: int, keep: Path | None, estimator: str = "muse") -> dict:
    """Per pair and cut, S8 of both mocks and the shift (finer - model) over the model's sd."""
    rows, res = [], {"estimator": estimator, "pairs": [], "summary": {},
                     "goal": "shift under 0.5 posterior sd with the cut"}
    for i in range(pairs):
        for c in ("all", "cut"):
            recs = {m: _record(out, keep, i, m, c, estimator) for m in MOCKS}
            if not all(recs.values()):
                continue
            d = {m: s8_of(json.loads(p.read_text())) for m, p in recs.items()}
            sd = d["model"]["sd"]
            mc = float(np.hypot(d["model"]["mc_sd"], d["finer"]["mc_sd"])) / sd
            row = {"pair": i, "cut": c, "S8_model": d["model"]["S8"], "S8_finer": d["finer"]["S8"], "sd_model": sd,
                   "sd_finer": d["finer"]["sd"], "shift_over_sd": (d["finer"]["S8"] - d["model"]["S8"]) / sd,
                   "mc_sd_of_shift_over_sd": mc, "converged": all(d[m]["converged"] for m in MOCKS)}
            rows.append(row)
            res["pairs"].append(row)
    for c in ("all", "cut"):
        sh = np.array([r["shift_over_sd"] for r in rows if r["cut"] == c])
        if sh.size:
            res["summary"][c] = {"pairs": int(sh.size), "mean_shift_over_sd": float(sh.mean()),
                                 "se": float(sh.std(ddof=1) / np.sqrt(sh.size)) if sh.size > 1 else None,
                                 "max_abs_shift_over_sd": float(np.abs(sh).max())}
    return res


def figure(res: dict, path: Path) -> Path:
    """Each pair's S8 shift over the model mock's sd, with and without the cut, with its Monte
    Carlo error bar and the goal's band (|shift| < 0.5)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.axhspan(-0.5, 0.5, color="0.9", label="goal with the cut: |shift| < 0.5 sd")
    ax.axhline(0.0, color="0.5", lw=0.8)
    for k, (c, label) in enumerate((("all", "every pixel"), ("cut", "lensing.ell_max cut"))):
        rows = [r for r in res["pairs"] if r["cut"] == c]
        if rows:
            x = np.array([r["pair"] for r in rows]) + (k - 0.5) * 0.2
            ax.errorbar(x, [r["shift_over_sd"] for r in rows], yerr=[r["mc_sd_of_shift_over_sd"] for r in rows],
                        fmt="o" if c == "all" else "s", capsize=3, label=label,
                        mfc="none" if c == "all" else None)
    ax.set_xlabel("pair")
    ax.set_ylabel("S8 shift, finer - model (model's sd)")
    ax.set_title(f"model error on S8 ({res['estimator']})")
    pairs = sorted({r["pair"] for r in res["pairs"]})
    ax.set_xticks(pairs)
    ax.set_xlim(pairs[0] - 0.6, pairs[-1] + 0.6)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="study directory (observations and analyses)")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--finer", required=True, help="overrides (space-separated) that make the finer simulation")
    ap.add_argument("--ell-max", default="300,600", help="lensing.ell_max of the cut analyses, one per bin")
    ap.add_argument("--estimator", choices=ESTIMATORS, default="muse",
                    help="muse: fli-map's MUSE estimate | mclmc: fli-sample's MCLMC chains, then fli-diagnose")
    ap.add_argument("--core", type=int, default=0, help="the core the analyses are pinned to")
    ap.add_argument("--keep", type=Path, help="copy each finished analysis's record here; those count as done")
    ap.add_argument("--mocks-only", action="store_true", help="make the pairs' observations, analyse nothing")
    ap.add_argument("--json", type=Path, help="write the summary here too")
    ap.add_argument("overrides", nargs="*", help="the analysis config's overrides (after --)")
    a = ap.parse_args(argv)
    from fli.config import ConfigError  # noqa: PLC0415

    try:
        check_finer(a.overrides, a.finer.split(), a.ell_max)  # bad input stops here, before anything is written
        a.out.mkdir(parents=True, exist_ok=True)
        analyse(a.out, a.pairs, a.overrides, a.finer.split(), a.ell_max, a.core, a.keep, a.mocks_only, a.estimator)
    except ConfigError as e:
        print(f"scripts.studies.model_error: {e}", file=sys.stderr)
        return 2
    if a.mocks_only:
        return 0
    res = report(a.out, a.pairs, a.keep, a.estimator)
    if res["pairs"]:
        res["figure"] = str(figure(res, a.out / "model_error_shifts.png"))
    emit(res, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
