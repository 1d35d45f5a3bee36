#!/usr/bin/env python
"""Does MUSE agree with the sampled posterior? One mock, MUSE's map.json against fli-diagnose's
diagnostics.json of chains on the same mock and model.

Per parameter (Omega_c, sigma8, S8): MUSE's value and sd (its latent Gaussian pushed through the
prior, as fli-map writes them) beside the chains' mean and sd, and

* ``offset``: (MUSE value - chains' mean) / chains' sd, with its Monte Carlo error from the
  chains' MCSE of the mean and MUSE's own ``mc_sd`` (its simulations' noise), added in quadrature;
* ``sd_ratio``: MUSE's sd / the chains' sd, with the error the chains' MCSE of the sd gives it
  (MUSE's sd has no Monte Carlo error in map.json's physical block, so none is added);
* issue 21's verdict for S8: |offset| <= 0.3 and |sd_ratio - 1| <= 0.25.

The cost side: MUSE's gradient evaluations and seconds beside what the chains would need for a
bulk ESS of 400 in S8 at their measured rate (post-warm-up gradients only; the warm-up's are
reported apart when the chains' runs are given).

    python -m scripts.studies.muse_vs_chains --muse docs/bench/muse_tsc_pair0_map.json \\
        --chains <fli-diagnose run>/diagnostics.json --json docs/bench/muse_vs_mclmc_pm_tsc.json

``--chains`` given several times reads independent runs of chains on the same mock and model as
one reference (:func:`combine`): a run whose draws are gone (an earlier comparison's JSON)
beside new runs' diagnostics.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

PARAMS = ("Omega_c", "sigma8", "S8")
OFFSET_MAX = 0.3  # issue 21: theta_MUSE within 0.3 posterior sd of the posterior mean
RATIO_TOL = 0.25  # issue 21: sigma_MUSE within 25 % of the posterior sd
ESS_TARGET = 400.0


def _load(path: Path, what: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"--{what} {path}: cannot read it as JSON ({e})") from None


def from_record(rec: dict) -> dict:
    """An earlier comparison's JSON (this script's ``--json``) read as the chains' diagnostics:
    their summaries per parameter and their run, where the chains' own files are gone (another
    machine) and MUSE is compared with them again."""
    run = rec.get("chains_run") or {}
    rate = run.get("S8_ess_bulk_per_1000_grads")
    return {"params": {k: v["chains"] for k, v in rec["params"].items()}, "chains": run.get("chains"),
            "draws_per_chain": run.get("draws_per_chain"), "verdict": run.get("verdict"),
            "efficiency": {"gradient_evals": run.get("post_warmup_gradient_evals"), "seconds": run.get("seconds"),
                           "params": {"S8": {"ess_bulk_per_1000_grads": rate}}},
            "from_record": rec.get("chains_source")}


def as_diagnostics(d: dict) -> dict:
    """``d`` as fli-diagnose's diagnostics: itself, or an earlier comparison's JSON read by
    :func:`from_record`."""
    return from_record(d) if "muse_source" in d and "params" in d else d


def combine(diags: list[dict]) -> dict:
    """Independent runs of chains on one posterior (each fli-diagnose's diagnostics.json or an
    earlier comparison's JSON), read as one: per parameter the mean and the sd are each
    inverse-variance weighted by their parts' Monte Carlo errors (``mcse_mean``, ``mcse_sd``),
    whose combined error is ``(sum 1 / mcse^2)^-1/2``; the ESSs, chains, gradient evaluations
    and seconds add up; R-hat is the worst part's. For runs whose draws are not all at hand
    (an earlier run's files gone): where they are, fli-diagnose over all the runs is better."""
    parts = [as_diagnostics(d) for d in diags]
    if len(parts) == 1:
        return parts[0]
    params: dict = {}
    for k in parts[0].get("params") or {}:
        rows = [p["params"].get(k) for p in parts]
        if any(r is None or not r.get("mcse_mean") or not r.get("mcse_sd") for r in rows):
            continue  # a parameter some part lacks, or without its errors, is left out
        row: dict = {}
        for x in ("mean", "sd"):
            w = [1.0 / r[f"mcse_{x}"] ** 2 for r in rows]
            row[x] = sum(wi * r[x] for wi, r in zip(w, rows, strict=True)) / sum(w)
            row[f"mcse_{x}"] = sum(w) ** -0.5
        for x in ("ess_bulk", "ess_tail"):
            row[x] = sum(r[x] for r in rows) if all(r.get(x) is not None for r in rows) else None
        row["rhat"] = max((r["rhat"] for r in rows if r.get("rhat") is not None), default=None)
        params[k] = row
    effs = [p.get("efficiency") or {} for p in parts]
    total = lambda key: sum(e[key] for e in effs) if all(e.get(key) is not None for e in effs) else None
    grads, s8 = total("gradient_evals"), params.get("S8", {})
    rate = 1000.0 * s8["ess_bulk"] / grads if grads and s8.get("ess_bulk") is not None else None
    return {"params": params, "chains": sum(p.get("chains") or 0 for p in parts),
            "draws_per_chain": [p.get("draws_per_chain") for p in parts], "verdict": [p.get("verdict") for p in parts],
            "efficiency": {"gradient_evals": grads, "seconds": total("seconds"),
                           "params": {"S8": {"ess_bulk_per_1000_grads": rate}}},
            "combined_from": len(parts)}


def compare(muse_map: dict, diag: dict) -> dict:
    """The comparison, per parameter, and the verdict on S8. ``diag``: fli-diagnose's
    diagnostics.json, or an earlier comparison's JSON (:func:`from_record`)."""
    diag = as_diagnostics(diag)
    muse = muse_map.get("muse")
    if not muse or "params" not in muse:
        raise SystemExit("--muse: map.json has no 'muse' block (run fli-map with inference.map.estimator=muse)")
    chains = diag.get("params")
    if not chains:
        raise SystemExit("--chains: diagnostics.json has no 'params' block (is it fli-diagnose's?)")
    truth = muse_map.get("truth") or {}
    out: dict = {"params": {}}
    for k in PARAMS:
        c = chains.get(k)
        if c is None:
            raise SystemExit(f"--chains: diagnostics.json has no parameter {k!r} (has {sorted(chains)})")
        value, sd, mc = muse["params"][k], muse["sd"][k], (muse.get("mc_sd") or {}).get(k, 0.0)
        offset = (value - c["mean"]) / c["sd"]
        offset_err = math.hypot(c["mcse_mean"], mc) / c["sd"]
        ratio = sd / c["sd"]
        ratio_err = ratio * c["mcse_sd"] / c["sd"] if c.get("mcse_sd") is not None else None
        row = {"muse": {"value": value, "sd": sd, "mc_sd": mc},
               "chains": {x: c.get(x) for x in ("mean", "sd", "mcse_mean", "mcse_sd", "ess_bulk", "ess_tail", "rhat")},
               "offset": offset, "offset_mc_err": offset_err, "sd_ratio": ratio, "sd_ratio_mc_err": ratio_err}
        if k in truth:
            row["truth"] = truth[k]
            row["muse_pull"] = (value - truth[k]) / sd
            row["chains_pull"] = (c["mean"] - truth[k]) / c["sd"]
        out["params"][k] = row
    s8 = out["params"]["S8"]
    out["criterion"] = {
        "what": f"S8: |offset| <= {OFFSET_MAX} and |sd_ratio - 1| <= {RATIO_TOL} (issue 21)",
        "offset_ok": abs(s8["offset"]) <= OFFSET_MAX,
        "sd_ratio_ok": abs(s8["sd_ratio"] - 1.0) <= RATIO_TOL,
    }
    out["criterion"]["pass"] = out["criterion"]["offset_ok"] and out["criterion"]["sd_ratio_ok"]
    out["muse_run"] = {x: muse.get(x) for x in ("converged", "iterations", "grad_evals", "seconds", "settings",
                                                 "h_unresolved")}
    eff = diag.get("efficiency") or {}
    rate = ((eff.get("params") or {}).get("S8") or {}).get("ess_bulk_per_1000_grads")
    out["chains_run"] = {"chains": diag.get("chains"), "draws_per_chain": diag.get("draws_per_chain"),
                         "post_warmup_gradient_evals": eff.get("gradient_evals"), "seconds": eff.get("seconds"),
                         "S8_ess_bulk_per_1000_grads": rate,
                         "post_warmup_grads_to_ess_400": None if not rate else 1000.0 * ESS_TARGET / rate,
                         "verdict": diag.get("verdict"), "combined_from": diag.get("combined_from")}
    return out


def figure(muse_map: dict, draws_nc: Path, overrides: list[str], path: Path) -> Path:
    """The chains' marginals beside MUSE's Gaussian drawn in the latents and pushed through the
    prior (as fli-map's values are), the prior's own draws and the truth."""
    import arviz as az  # noqa: PLC0415
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from scripts.studies.muse_calibration import _physical, _prior  # noqa: PLC0415

    _, prior = _prior(overrides)
    rng = np.random.default_rng(0)
    m = muse_map["muse"]
    muse = _physical(prior, rng.multivariate_normal(np.asarray(m["theta_z"]), np.asarray(m["cov_z"]), 100_000))
    pri = _physical(prior, rng.standard_normal((100_000, prior.n)))
    post = az.from_netcdf(str(draws_nc)).posterior
    truth = muse_map.get("truth") or {}
    fig, axes = plt.subplots(1, len(PARAMS), figsize=(4.2 * len(PARAMS), 3.4))
    for ax, k in zip(axes, PARAMS, strict=True):
        x = np.asarray(post[k].values).ravel()
        bins = np.linspace(min(pri[k].min(), x.min()), max(pri[k].max(), x.max()), 50)
        ax.hist(pri[k], bins, density=True, color="0.85", label="prior")
        ax.hist(x, bins, density=True, histtype="step", lw=2, color="C0",
                label=f"chains {x.mean():.3f} ± {x.std():.3f}")
        ax.hist(muse[k], bins, density=True, histtype="step", lw=2, color="C1",
                label=f"MUSE {m['params'][k]:.3f} ± {m['sd'][k]:.3f}")
        if k in truth:
            ax.axvline(truth[k], color="k", ls="--", lw=1, label="truth")
        ax.set_xlabel(k)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("density")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--muse", type=Path, required=True, help="fli-map's map.json of a MUSE run")
    ap.add_argument("--chains", type=Path, required=True, action="append",
                    help="fli-diagnose's diagnostics.json of chains on that mock, or an earlier comparison's --json "
                         "(its chains' summaries, where their files are gone); given again for independent runs, "
                         "which are read as one (their summaries weighted by their Monte Carlo errors)")
    ap.add_argument("--note", default="", help="what the mock and runs were, kept in the JSON")
    ap.add_argument("--json", type=Path, help="write the comparison here too")
    ap.add_argument("--draws", type=Path, help="fli-diagnose's chains.nc, for --figure")
    ap.add_argument("--figure", type=Path, help="draw the marginals here (needs --draws)")
    ap.add_argument("overrides", nargs="*", help="config overrides of the runs (after --), for the prior of --figure")
    a = ap.parse_args(argv)
    if a.figure is not None and a.draws is None:
        ap.error("--figure needs --draws (fli-diagnose's chains.nc)")
    diag = combine([_load(c, "chains") for c in a.chains])
    res = {"note": a.note, "muse_source": str(a.muse),
           "chains_source": str(a.chains[0]) if len(a.chains) == 1 else [str(c) for c in a.chains],
           **compare(_load(a.muse, "muse"), diag)}
    text = json.dumps(res, indent=1)
    print(text)
    if a.json:
        tmp = a.json.with_name(f".{a.json.name}.tmp")
        tmp.write_text(text + "\n")
        tmp.rename(a.json)
    if a.figure is not None:
        print(f"figure: {figure(_load(a.muse, 'muse'), a.draws, a.overrides, a.figure)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
