#!/usr/bin/env python
"""The report of scripts/studies/map_study.py: its printed tables and its figures, drawn from its JSON.

Each study's JSON in ``docs/bench/`` (``map_study_<name><suffix>.json``) is read back and

* ``table_bias`` prints study 1 (``map_study_bias*.json``): the joint MAP's error per noise
  level and parameter, mean and std over seeds, beside the Laplace marginal std;
  ``fig_bias`` draws the MAPs in (Omega_c, sigma8) around the truth, with the Laplace
  1-sigma ellipse, as ``docs/figures/map_bias<suffix>.png``;
* ``table_lightcone`` prints study 2 (``map_study_lightcone*.json``): the MAP's error with the
  traced and the fiducial light cone and their difference (no figure);
* ``table_anneal`` prints study 3 (``map_study_anneal*.json``): each optimiser's final loss over
  the best, and the step and evaluation counts to come within 1 of it; ``fig_anneal`` draws the
  exact loss against steps and against evaluations, ``docs/figures/map_anneal<suffix>.png``;
* ``table_recovery`` prints study 4 (``map_study_recovery*.json``): r_ell of the MAP's kappa
  against the Wiener sqrt(S/(S+N)) per bin, the field's r(k) and T(k), and the linear forward's
  MAP against CG; ``fig_recovery`` draws those curves, ``docs/figures/map_recovery<suffix>.png``.

Not run on its own: ``python -m scripts.studies.map_study --figures`` (with ``--suffix`` for the
suffixed JSON) prints the tables and redraws the figures; each study prints its table too.
"""

from __future__ import annotations

import numpy as np


def table_bias(d):
    print("\nStudy 1: joint-MAP error (MAP - truth), mean +- std over seeds; Laplace marginal std")
    print(f"{'noise':>10} {'param':>8} {'mean':>9} {'std':>8} {'laplace':>8} {'bias/lap':>8}")
    for name, v in d["summary"].items():
        for k in ("Omega_c", "sigma8", "S8"):
            x = v[k]
            lap = x["laplace_marginal_std"]
            print(f"{name:>10} {k:>8} {x['mean_error']:+9.4f} {x['std_error'] or float('nan'):8.4f} "
                  f"{lap if lap is not None else float('nan'):8.4f} "
                  f"{x['bias_over_laplace'] if x['bias_over_laplace'] is not None else float('nan'):+8.2f}")


def table_lightcone(d):
    print("\nStudy 2: error of the joint MAP, low_s8 truth, planck18 fiducial (mean over seeds)")
    for name in ("traced", "fiducial", "fiducial_minus_traced"):
        if name not in d["results"]:
            continue
        v = d["results"][name]
        m = v["mean_error"] if "mean_error" in v else {k: v[k]["mean"] for k in v}
        print(f"{name:>22} " + " ".join(f"{k} {m[k]:+.4f}" for k in ("Omega_c", "sigma8", "S8")))


def table_anneal(d):
    print("\nStudy 3: annealing (exact loss; best = lowest final loss of the four on each seed)")
    print(f"{'method':>14} {'final-best':>11} {'step<=best+1':>14} {'evals':>12} {'r_ell':>6}")
    for k, v in d["summary"].items():
        print(f"{k:>14} {v['final_minus_best_mean']:11.3f} {str(v['step_within_1']):>14} "
              f"{str(v['evals_within_1']):>12} {v['r_ell_mean']:6.3f}")


def table_recovery(d):
    print("\nStudy 4: r_ell of the MAP's noiseless kappa vs Wiener sqrt(S/(S+N))")
    for b in d["kappa"]:
        print(f"bin {b['bin']}: max|r-W| (S/N>1) {b['max_dev_where_snr_gt_1']}, within 0.1: "
              f"{b['within_0.1_where_snr_gt_1']}, ell(r<0.5) {b['ell_r_half']}, ell(W<0.5) {b['ell_wiener_half']}")
    for part, v in d["field"].items():
        print(f"field {part:>10}: k(r<0.5) {v['k_r_half']}, k(T<0.5) {v['k_T_half']}")
    if "linear_cg" in d:
        print(f"linear forward: |s_MAP - s_CG| / |s_CG| = {d['linear_cg']['relative_difference']:.2e}")


def fig_anneal(d, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"lbfgs": "C0", "lbfgs_anneal": "C1", "adam": "C2", "adam_anneal": "C3"}
    for row in d["runs"]:
        for name, v in row["methods"].items():
            ex = np.asarray(v["exact_loss"]) - row["best_loss"] + 1e-2
            lab = name if row is d["runs"][0] else None
            axes[0].semilogy(np.arange(1, len(ex) + 1), ex, color=colors[name], lw=1, label=lab, alpha=0.8)
            axes[1].semilogy(v["evals"], ex, color=colors[name], lw=1, label=lab, alpha=0.8)
    for ax, xl in zip(axes, ("optimiser step", "value-and-gradient evaluations"), strict=True):
        ax.axhline(1.0, color="k", ls=":", lw=0.8)
        ax.set_xlabel(xl)
        ax.set_ylabel("U - U_best + 0.01 (exact loss)")
        ax.legend(fontsize=8)
    fig.suptitle(f"fli-map annealing, {' '.join(d['config'])}: {len(d['runs'])} seeds "
                 f"(stages {d['anneal_arcmin']} arcmin x {d['anneal_steps']} steps)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fig_recovery(d, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for b in d["kappa"]:
        c = f"C{b['bin']}"
        axes[0].plot(b["ell"], b["r_ell"], color=c, label=f"bin {b['bin']} MAP")
        axes[0].plot(b["ell"], b["wiener"], color=c, ls="--", label="sqrt(S/(S+N))" if b["bin"] == 0 else None)
    axes[0].set_xlabel("ell")
    axes[0].set_ylabel("r_ell (MAP vs true noiseless kappa)")
    axes[0].set_ylim(-0.1, 1.05)
    axes[0].legend(fontsize=7)
    for part, ls in (("cone", "-"), ("transverse", "--"), ("all", ":")):
        v = d["field"][part]
        axes[1].plot(v["k"], v["r"], "C0" + ls, label=f"r(k) {part}")
        axes[1].plot(v["k"], v["T"], "C1" + ls, label=f"T(k) {part}")
    axes[1].set_xscale("log")
    axes[1].set_xlabel("k [h/Mpc]")
    axes[1].set_ylim(-0.1, 1.3)
    axes[1].axhline(0.5, color="k", ls=":", lw=0.8)
    axes[1].legend(fontsize=7)
    fig.suptitle(f"recovery, {len(d['seeds'])} seeds (mean)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fig_bias(d, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    t = d["truth"]
    for i, (name, mk) in enumerate((("depth_1", "o"), ("depth_10", "s"))):
        rr = [r for r in d["runs"] if f"depth_{r['depth']:g}" == name]
        ax.scatter([r["map"]["Omega_c"] for r in rr], [r["map"]["sigma8"] for r in rr], marker=mk, color=f"C{i}",
                   label=f"joint MAP, n_gal x{name.split('_')[1]}")
        lap = [r["laplace"]["exact"] for r in rr if "laplace" in r and "marginal" in r["laplace"].get("exact", {})]
        if lap:
            cov = np.asarray(lap[0]["marginal"]["cov"])
            w, v = np.linalg.eigh(cov)
            a = np.linspace(0, 2 * np.pi, 100)
            e = (v @ (np.sqrt(np.maximum(w, 0))[:, None] * np.stack([np.cos(a), np.sin(a)])))
            ax.plot(t["Omega_c"] + e[0], t["sigma8"] + e[1], color=f"C{i}", lw=1,
                    label="Laplace marginal 1-sigma (seed 0), at the truth")
    ax.plot(t["Omega_c"], t["sigma8"], "k*", ms=12, label="truth")
    ax.set_xlabel("Omega_c")
    ax.set_ylabel("sigma8")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
