#!/usr/bin/env python
"""Studies of fli-map's joint MAP on small configs: bias, light cone, annealing, recovery.

Each study compiles its jitted functions ONCE per configuration (one Posterior, one optimiser
step from :func:`fli.infer.fit.optimize.make_step`, compiled ahead of time) and loops over mock
seeds by changing only the data and the initial latents (same shapes: no recompilation).
Mocks are made as ``fli-mock`` makes them: the posterior's own forward ``post.fwd`` at the
truth cosmology on ``fli.sim.sharding.white_noise(seed, ...)``, plus the mock's shape noise
``fli.mock.add_shape_noise(seed, ...)``. ``fli.mock.make_mock`` itself is not called: it builds
and compiles a forward at the config's truth for every mock, while this script jits ``post.fwd``
once and varies the truth.

Usage (each flag runs one study, writes ``docs/bench/map_study_<name>.json`` and prints a table)::

    python -m scripts.studies.map_study --bias --lightcone --anneal   # tiny config, shares one compile
    python -m scripts.studies.map_study --recovery --linear-cg          # 32x32x64, 4 source bins
    python -m scripts.studies.map_study --figures                       # redraw figures from the JSON

Options: ``--seeds N``, ``--steps N`` (L-BFGS budget of the joint MAP), ``--suffix`` (appended to
the JSON and figure names). Numbers and their reading: docs/map.md. The tables and figures are
drawn by scripts/studies/map_study_report.py; the compiled pieces (``Setup``) are scripts/studies/map_study_setup.py.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "docs" / "bench"
FIGS = ROOT / "docs" / "figures"
from scripts.studies.map_study_report import (  # noqa: E402
    fig_anneal,
    fig_bias,
    fig_recovery,
    table_anneal,
    table_bias,
    table_lightcone,
    table_recovery,
)
from scripts.studies.map_study_setup import Setup, lbfgs_cfg, log  # noqa: E402

TINY = ["experiment=tiny"]
# 32 x 32 x 64 cells over the tiny box (10 x 10 x 56 Mpc/h cells), 32 x 32 pixels of 9.4 arcmin,
# four Smail source bins with n_gal = 30 arcmin^-2 each (a deep survey)
RECOVERY = ["experiment=tiny", "simulation.mesh=[32,32,64]", "lensing.npix=32", "simulation.halo=3",
            "survey.bins=[" + ",".join(
                f"{{kind:smail,z0:{z0},alpha:2.0,beta:1.5,z_min:{lo},z_max:{hi},n_gal:30.0}}"
                for z0, lo, hi in ((0.3, 0.2, 0.5), (0.5, 0.5, 0.8), (0.7, 0.8, 1.1), (0.9, 1.1, 1.6))) + "]"]
PLANCK = {"Omega_c": 0.2607, "sigma8": 0.8102}
DEEP = 10.0  # the deep survey has DEEP times the galaxy density: sigma_b / sqrt(DEEP)


# ============================================================================ study 1: bias


def study_bias(s: Setup, seeds, steps, fo_steps, laplace_seeds, out_path):
    truth = dict(PLANCK)
    tp = s.truth_phys(truth)
    th_true = s.theta_of(truth)
    mj = lbfgs_cfg(s, steps)
    mf = lbfgs_cfg(s, fo_steps)
    rows = []
    for depth in (1.0, DEEP):
        sig = s.sigma(depth)
        for seed in seeds:
            w, kt = s.mock(truth, seed)
            data = s.data(kt, sig, seed)
            run, _, sec, err = s.fit(mj, data)
            pj = s.phys(run.params.theta)
            uj, aj = s.pot_j(run.params, data)
            frun, _, fsec, ferr = s.fit(mf, data, theta_fixed=th_true, tag="field")
            uf, af = s.pot_j(frun.params, data)
            from fli.infer.posterior.model import Latents
            ut, _ = s.pot_j(Latents(th_true, w), data)
            row = {"depth": depth, "sigma": sig.tolist(), "seed": seed, "map": pj,
                   "error": {k: pj[k] - tp[k] for k in ("Omega_c", "sigma8", "S8")},
                   "loss_joint": float(uj), "chi2_joint": float(aj["chi2"]), "steps_joint": run.step,
                   "converged_joint": run.below_tol >= mj.patience, "grad_evals_joint": int(sum(h[2] for h in run.history)),
                   "seconds_joint": sec, "error_joint": err,
                   "loss_field_only": float(uf), "chi2_field_only": float(af["chi2"]), "steps_field_only": frun.step,
                   "converged_field_only": frun.below_tol >= mf.patience, "seconds_field_only": fsec,
                   "loss_truth": float(ut), "n_data": int(np.prod(kt.shape))}
            if seed in laplace_seeds:
                row["laplace"] = s.laplace(run.params, data)
            rows.append(row)
            lap = row.get("laplace", {}).get("exact", {}).get("marginal", {}).get("std", {})
            log(f"bias depth {depth:g} seed {seed}: dOc {row['error']['Omega_c']:+.4f} ds8 {row['error']['sigma8']:+.4f} "
                f"dS8 {row['error']['S8']:+.4f} U_joint {uj:.2f} U_field(theta_true) {uf:.2f} U_truth {ut:.2f} "
                f"steps {run.step}/{frun.step} ({sec:.0f}+{fsec:.0f} s) laplace {lap}")
            _dump(out_path, _bias_summary(s, rows, truth, mj, mf, seeds))
    return _bias_summary(s, rows, truth, mj, mf, seeds)


def _bias_summary(s, rows, truth, mj, mf, seeds):
    summ = {}
    for depth in sorted({r["depth"] for r in rows}):
        rr = [r for r in rows if r["depth"] == depth]
        d = {}
        for k in ("Omega_c", "sigma8", "S8"):
            e = np.array([r["error"][k] for r in rr])
            laps = [r["laplace"]["exact"]["marginal"]["std"][k] for r in rr
                    if "laplace" in r and "marginal" in r["laplace"].get("exact", {})]
            lapc = [r["laplace"]["exact"]["conditional"]["std"][k] for r in rr
                    if "laplace" in r and "conditional" in r["laplace"].get("exact", {})]
            lap = float(np.mean(laps)) if laps else None
            d[k] = {"mean_error": float(e.mean()), "std_error": float(e.std(ddof=1)) if len(e) > 1 else None,
                    "sem": float(e.std(ddof=1) / math.sqrt(len(e))) if len(e) > 1 else None,
                    "laplace_marginal_std": lap, "laplace_conditional_std": float(np.mean(lapc)) if lapc else None,
                    "bias_over_laplace": float(e.mean() / lap) if lap else None}
        d["n_seeds"] = len(rr)
        d["loss_joint_minus_field_only"] = float(np.mean([r["loss_joint"] - r["loss_field_only"] for r in rr]))
        d["converged_joint"] = sum(r["converged_joint"] for r in rr)
        d["converged_field_only"] = sum(r["converged_field_only"] for r in rr)
        d["sigma"] = rr[0]["sigma"]
        summ[f"depth_{depth:g}"] = d
    return {"study": "joint-MAP bias of theta", "config": s.overrides, "truth": s.truth_phys(truth),
            "map": {"optimizer": "lbfgs", "steps": mj.steps, "tol": mj.tol, "patience": mj.patience,
                    "field_only_steps": mf.steps, "start": "prior mode (theta = 0, s = 0)"},
            "deep_factor_n_gal": DEEP, "seeds": list(seeds), "summary": summ, "runs": rows,
            "compile_s": {str(k): v[2] for k, v in s._steps.items()}}


# ============================================================================ study 2: light cone


def study_lightcone(s_traced: Setup, seeds, steps, out_path):
    from fli.cli.compose import compose

    low, _ = compose(["cosmology=low_s8"])  # the truth's two sampled parameters; the rest stay planck18
    truth = {"Omega_c": float(low.cosmology.Omega_c), "sigma8": float(low.cosmology.sigma8)}
    s_fid = Setup([*s_traced.overrides, "lensing.lightcone=fiducial"])
    tp = s_traced.truth_phys(truth)
    res = {}
    sig = s_traced.sigma(1.0)
    for name, s in (("traced", s_traced), ("fiducial", s_fid)):
        mj = lbfgs_cfg(s, steps)
        rows = []
        for seed in seeds:
            _, kt = s_traced.mock(truth, seed)  # the truth's own light cone (traced at the truth)
            data = s.data(kt, sig, seed)
            run, _, sec, err = s.fit(mj, data)
            p = s.phys(run.params.theta)
            rows.append({"seed": seed, "map": p, "error": {k: p[k] - tp[k] for k in ("Omega_c", "sigma8", "S8")},
                         "steps": run.step, "converged": run.below_tol >= mj.patience, "seconds": sec,
                         "loss": float(s.pot_j(run.params, data)[0]), "error_msg": err})
            log(f"lightcone {name} seed {seed}: {rows[-1]['error']} steps {run.step} ({sec:.0f} s)")
        res[name] = {"runs": rows, "mean_error": {k: float(np.mean([r["error"][k] for r in rows]))
                                                  for k in ("Omega_c", "sigma8", "S8")},
                     "std_error": {k: float(np.std([r["error"][k] for r in rows], ddof=1)) if len(rows) > 1 else None
                                   for k in ("Omega_c", "sigma8", "S8")}}
        _dump(out_path, {"study": "fiducial vs traced light cone", "truth": tp, "fiducial": "planck18",
                         "config": s_traced.overrides, "steps": steps, "results": res})
    if "fiducial" in res:
        # per-seed difference (same mock, same noise): the light cone's own effect
        diff = {k: [f["error"][k] - t["error"][k] for f, t in zip(res["fiducial"]["runs"], res["traced"]["runs"],
                                                                    strict=True)] for k in ("Omega_c", "sigma8", "S8")}
        res["fiducial_minus_traced"] = {k: {"mean": float(np.mean(v)),
                                            "std": float(np.std(v, ddof=1)) if len(v) > 1 else None, "per_seed": v}
                                        for k, v in diff.items()}
    out = {"study": "fiducial vs traced light cone", "truth": tp, "fiducial": "planck18",
           "config": s_traced.overrides, "steps": steps, "results": res}
    _dump(out_path, out)
    return out


# ============================================================================ study 3: annealing


ANNEAL_ARCMIN = [64.0, 32.0, 16.0, 8.0]  # the default [16, 8, 4, 2] in pixels of the default map, at 18.75'


def study_anneal(s: Setup, seeds, steps, adam_steps, anneal_steps, out_path):
    from fli.infer.fit.metrics import kappa_metrics

    truth = dict(PLANCK)
    sig = s.sigma(1.0)
    methods = {
        "lbfgs": lbfgs_cfg(s, steps, anneal=False),
        "lbfgs_anneal": lbfgs_cfg(s, steps, anneal=True, anneal_arcmin=ANNEAL_ARCMIN, anneal_steps=anneal_steps),
        "adam": dataclasses.replace(s.mcfg, optimizer="adam", steps=adam_steps, anneal=False),
        "adam_anneal": dataclasses.replace(s.mcfg, optimizer="adam", steps=adam_steps, anneal=True,
                                           anneal_arcmin=ANNEAL_ARCMIN, anneal_steps=anneal_steps),
    }
    rows = []
    for seed in seeds:
        _, kt = s.mock(truth, seed)
        data = s.data(kt, sig, seed)
        per = {}
        for name, m in methods.items():
            run, exact, sec, err = s.fit(m, data, exact_every_step=True)
            kap = s.predict_j(run.params)
            mm = kappa_metrics(kap, kt, s.fov)
            per[name] = {"exact_loss": exact, "objective": [h[0] for h in run.history],
                         "evals": np.cumsum([h[2] for h in run.history]).tolist(), "stage": [h[4] for h in run.history],
                         "final_loss": exact[-1] if exact else None, "steps": run.step, "seconds": sec,
                         "params": s.phys(run.params.theta), "r_ell": mm["r"], "ell": mm["ell"],
                         "r_ell_mean": float(np.nanmean(mm["r"])), "error_msg": err}
            log(f"anneal seed {seed} {name}: final {per[name]['final_loss']:.3f} steps {run.step} ({sec:.0f} s) "
                f"r_ell mean {per[name]['r_ell_mean']:.3f}")
        best = min(v["final_loss"] for v in per.values() if v["final_loss"] is not None)
        for v in per.values():
            ex = np.asarray(v["exact_loss"])
            hit = np.nonzero(ex <= best + 1.0)[0]
            v["step_within_1"] = int(hit[0]) + 1 if hit.size else None
            v["evals_within_1"] = int(v["evals"][hit[0]]) if hit.size else None
            v["final_minus_best"] = float(ex[-1] - best)
        rows.append({"seed": seed, "best_loss": best, "methods": per})
        _dump(out_path, _anneal_summary(s, rows, methods, anneal_steps))
    out = _anneal_summary(s, rows, methods, anneal_steps)
    _dump(out_path, out)
    return out


def _anneal_summary(s, rows, methods, anneal_steps):
    summ = {}
    for name in methods:
        vs = [r["methods"][name] for r in rows]
        st = [v["step_within_1"] for v in vs]
        summ[name] = {"final_minus_best_mean": float(np.mean([v["final_minus_best"] for v in vs])),
                      "final_minus_best": [v["final_minus_best"] for v in vs],
                      "step_within_1": st, "evals_within_1": [v["evals_within_1"] for v in vs],
                      "r_ell_mean": float(np.mean([v["r_ell_mean"] for v in vs])),
                      "steps": [v["steps"] for v in vs], "grad_evals": [v["evals"][-1] for v in vs]}
    return {"study": "annealing", "config": s.overrides, "pixel_arcmin": s.pix_arcmin,
            "anneal_arcmin": ANNEAL_ARCMIN, "anneal_steps": anneal_steps,
            "methods": {k: {"optimizer": m.optimizer, "steps": m.steps, "anneal": m.anneal, "lr": m.lr,
                            "schedule": m.schedule} for k, m in methods.items()},
            "summary": summ, "runs": rows}


# ============================================================================ study 4: recovery


def wiener_curves(s: Setup, kts, sigma):
    """sqrt(S / (S + N)) per bin and ell bin: S the mean spectrum of the noiseless maps
    (tapered as in kappa_metrics), N = sigma_b^2 A_pix [sr]."""
    from fli.lensing.limber import map_power_spectrum

    npix = s.cfg.lensing.npix
    nbe = max(4, npix // 4)
    cls = []
    for kt in kts:
        ell, cl, _ = map_power_spectrum(np.asarray(kt), s.fov, nbe, taper=0.5)
        cls.append(cl)
    S = np.mean(cls, axis=0)
    a_pix = (math.radians(s.fov) / npix) ** 2
    N = (np.asarray(sigma) ** 2 * a_pix)[:, None] * np.ones_like(S)
    return np.asarray(ell), S, N, np.sqrt(S / (S + N))


def study_recovery(s: Setup, seeds, steps, out_path):
    from fli.infer.fit.map import truth_metrics
    from fli.infer.posterior.summaries import linear_field_of, truth_linear_field

    truth = dict(PLANCK)
    sig = s.sigma(1.0)
    mj = lbfgs_cfg(s, steps)
    rows, kts = [], []
    for seed in seeds:
        w, kt = s.mock(truth, seed)
        kts.append(np.asarray(kt))
        data = s.data(kt, sig, seed)
        run, _, sec, err = s.fit(mj, data)
        kap = s.predict_j(run.params)
        obs = SimpleNamespace(truth={**truth, "Omega_b": float(s.post.base.Omega_b)}, white_noise=w, kappa_true=kt)
        lin = (linear_field_of(s.post, run.params.theta, run.params.s), truth_linear_field(s.post, obs))
        met = truth_metrics(s.post, lin, obs, kap)
        rows.append({"seed": seed, "params": s.phys(run.params.theta), "steps": run.step,
                     "converged": run.below_tol >= mj.patience, "seconds": sec, "metrics": met, "error_msg": err})
        log(f"recovery seed {seed}: steps {run.step} ({sec:.0f} s) ell_r_half {met['kappa']['ell_r_half']} "
            f"k_r_half cone {met['field']['cone']['k_r_half']} transverse {met['field']['transverse']['k_r_half']}")
    ell, S, N, wien = wiener_curves(s, kts, sig)
    r = np.nanmean([row["metrics"]["kappa"]["r"] for row in rows], axis=0)  # [bins, ell]
    from fli.infer.fit.metrics import first_below
    per_bin = []
    for b in range(r.shape[0]):
        snr = S[b] / N[b]
        sel = snr > 1
        dev = np.abs(r[b] - wien[b])
        per_bin.append({"bin": b, "ell": ell.tolist(), "r_ell": r[b].tolist(), "wiener": wien[b].tolist(),
                        "S_over_N": snr.tolist(), "max_dev_where_snr_gt_1": float(np.nanmax(dev[sel])) if sel.any() else None,
                        "within_0.1_where_snr_gt_1": bool(np.all(dev[sel] < 0.1)) if sel.any() else None,
                        "ell_r_half": first_below(ell, r[b]), "ell_wiener_half": first_below(ell, wien[b])})
    fld = {}
    for part in ("all", "cone", "transverse"):
        rk = np.nanmean([row["metrics"]["field"][part]["r"] for row in rows], axis=0)
        tk = np.nanmean([row["metrics"]["field"][part]["T"] for row in rows], axis=0)
        k = rows[0]["metrics"]["field"][part]["k"]
        fld[part] = {"k": k, "r": rk.tolist(), "T": tk.tolist(), "k_r_half": first_below(k, rk),
                     "k_T_half": first_below(k, tk)}
    out = {"study": "recovery vs Wiener", "config": s.overrides, "sigma": sig.tolist(), "steps": steps,
           "seeds": list(seeds), "kappa": per_bin, "field": fld,
           "params": [row["params"] for row in rows], "runs": [{k: v for k, v in row.items() if k != "metrics"}
                                                              for row in rows]}
    _dump(out_path, out)
    return out


# ============================================================================ linear forward: MAP == CG


def linear_map_vs_cg(s: Setup, seed, steps, tol=1e-9):
    """Field-only MAP of the linear forward at the true theta against the exact posterior
    mean from CG on ``H x = -grad U(0)`` with ``H x = grad U(x) - grad U(0)`` (U quadratic in s)."""
    from fli.infer.fit.hvp import cg
    from fli.infer.posterior.model import Latents

    truth = dict(PLANCK)
    th = s.theta_of(truth)
    _, kt = s.mock(truth, seed)
    data = s.data(kt, s.sigma(1.0), seed)
    post = s.post

    @jax.jit
    def solve(data, zero):
        gs = lambda x: jax.grad(lambda ss: post.potential(Latents(th, ss), data))(x)
        g0 = gs(zero)
        return cg(lambda x: gs(x) - g0, -g0, tol=1e-6, maxiter=2000)

    t0 = time.perf_counter()
    x_cg, info = solve(data, s.init().s)
    t_cg = time.perf_counter() - t0
    m = lbfgs_cfg(s, steps, tol=tol, patience=5)
    run, _, sec, err = s.fit(m, data, theta_fixed=th, tag="linear_field")
    a, b = np.asarray(run.params.s, np.float64), np.asarray(x_cg, np.float64)
    rel = float(np.linalg.norm(a - b) / np.linalg.norm(b))
    out = {"seed": seed, "relative_difference": rel, "cg_iterations": int(info.iterations),
           "cg_relative_residual": float(info.relative_residual), "cg_seconds": t_cg,
           "map_steps": run.step, "map_seconds": sec, "map_converged": run.below_tol >= m.patience,
           "map_grad_evals": int(sum(h[2] for h in run.history)), "error_msg": err,
           "loss_map": float(s.pot_j(run.params, data)[0]),
           "loss_cg": float(s.pot_j(Latents(th, x_cg), data)[0])}
    log(f"linear MAP vs CG: rel {rel:.2e} (CG {out['cg_iterations']} it, MAP {run.step} steps)")
    return out


# ============================================================================ JSON


def _dump(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=float))
    tmp.rename(path)


# ============================================================================ main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bias", action="store_true")
    ap.add_argument("--lightcone", action="store_true")
    ap.add_argument("--anneal", action="store_true")
    ap.add_argument("--recovery", action="store_true")
    ap.add_argument("--linear-cg", action="store_true")
    ap.add_argument("--figures", action="store_true", help="redraw the figures from docs/bench/ and print tables")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=150, help="L-BFGS step budget of the joint MAP")
    ap.add_argument("--field-steps", type=int, default=100, help="L-BFGS budget of the field-only MAP")
    ap.add_argument("--laplace-seeds", type=int, default=1, help="seeds (per noise level) with a Laplace error")
    ap.add_argument("--lightcone-seeds", type=int, default=3)
    ap.add_argument("--anneal-seeds", type=int, default=3)
    ap.add_argument("--adam-steps", type=int, default=150)
    ap.add_argument("--anneal-steps", type=int, default=15, help="steps per smoothing stage")
    ap.add_argument("--recovery-seeds", type=int, default=3)
    ap.add_argument("--suffix", default="", help="appended to the JSON names (e.g. _quick)")
    ap.add_argument("--cache", default=str(Path("~/.cache/fli/jax").expanduser()))
    a = ap.parse_args(argv)
    if a.cache:
        jax.config.update("jax_compilation_cache_dir", a.cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.0)
    sfx = a.suffix
    paths = {n: BENCH / f"map_study_{n}{sfx}.json" for n in ("bias", "lightcone", "anneal", "recovery")}
    t0 = time.perf_counter()
    if a.bias or a.lightcone or a.anneal:
        tiny = Setup(TINY)
        log(f"tiny: {tiny.grid.shape} cells, {tiny.post.fwd.kappa_shape} map, pixel {tiny.pix_arcmin:.2f} arcmin, "
            f"sigma {tiny.sigma(1.0)}")
        if a.bias:
            d = study_bias(tiny, list(range(a.seeds)), a.steps, a.field_steps, set(range(a.laplace_seeds)),
                           paths["bias"])
            _dump(paths["bias"], d)
            table_bias(d)
        if a.anneal:
            d = study_anneal(tiny, list(range(a.anneal_seeds)), a.steps, a.adam_steps, a.anneal_steps, paths["anneal"])
            table_anneal(d)
        if a.lightcone:
            d = study_lightcone(tiny, list(range(a.lightcone_seeds)), a.steps, paths["lightcone"])
            table_lightcone(d)
    if a.recovery or a.linear_cg:
        out = json.loads(paths["recovery"].read_text()) if paths["recovery"].exists() else {}
        if a.recovery:
            rec = Setup(RECOVERY)
            log(f"recovery: {rec.grid.shape} cells, {rec.post.fwd.kappa_shape} map, sigma {rec.sigma(1.0)}")
            out.update(study_recovery(rec, list(range(a.recovery_seeds)), a.steps, paths["recovery"]))
            _dump(paths["recovery"], out)
        if a.linear_cg:
            lin = Setup([*RECOVERY, "simulation.forward=linear"])
            out["linear_cg"] = {"config": lin.overrides, **linear_map_vs_cg(lin, 0, 500)}
            _dump(paths["recovery"], out)
        if "kappa" in out:
            table_recovery(out)
    if a.figures:
        FIGS.mkdir(parents=True, exist_ok=True)
        for name, table, fig in (("bias", table_bias, fig_bias), ("lightcone", table_lightcone, None),
                                 ("anneal", table_anneal, fig_anneal), ("recovery", table_recovery, fig_recovery)):
            if paths[name].exists():
                d = json.loads(paths[name].read_text())
                try:
                    table(d)
                except (KeyError, TypeError) as e:
                    print(f"{name}: incomplete ({e})")
                    continue
                if fig is not None:
                    fig(d, FIGS / f"map_{name}{sfx}.png")
    log(f"done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
