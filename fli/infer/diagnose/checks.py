"""The verdicts of a diagnosis: each check's number against its pass and warn bands, the run's
overall verdict and its exit status, and the sampling's efficiency (ESS per gradient and per hour)."""

from __future__ import annotations

from pathlib import Path

from fli.config import DiagnoseConfig
from fli.infer.diagnose.chains import Chain

VERDICTS = ("pass", "warn", "fail")
# exit statuses: a verdict's, apart from bad input's 2 (every fli command's) and a crash's 1
EXIT_STATUS = {"pass": 0, "warn": 3, "fail": 4}
BAD_INPUT = 2


def efficiency(conv: dict, chains: list[Chain], n: int) -> dict:
    """ESS per 1000 gradient evaluations and per hour of sampling, over the draws used."""
    grads = sum(float(c.stats["gradient_evals"][n - 1]) - c.grads0 for c in chains)
    # a run of vectorised chains (its chain_<c>/) spent its time once for all of them, and each
    # chain records that whole time: one count per run
    per_run: dict[Path, float] = {}
    for c in chains:
        per_run[c.run_dir] = max(per_run.get(c.run_dir, 0.0), float(c.stats["seconds"][n - 1]) - c.seconds0)
    secs = sum(per_run.values())
    out = {"gradient_evals": grads, "seconds": secs,
           "note": "post-warm-up draws used, summed over the chains (seconds: the runs' sampling time added, "
                   "once for a run's vectorised chains; not the wall time of runs side by side)", "params": {}}
    for k, v in conv.items():
        e = {}
        for which in ("ess_bulk", "ess_tail"):
            ess = v[which]
            e[f"{which}_per_1000_grads"] = None if ess is None or grads <= 0 else 1000.0 * ess / grads
            e[f"{which}_per_hour"] = None if ess is None or secs <= 0 else 3600.0 * ess / secs
        out["params"][k] = e
    vals = [e["ess_bulk_per_1000_grads"] for e in out["params"].values()]
    out["ess_bulk_per_1000_grads_min"] = None if None in vals or not vals else min(vals)
    vals = [e["ess_bulk_per_hour"] for e in out["params"].values()]
    out["ess_bulk_per_hour_min"] = None if None in vals or not vals else min(vals)
    return out


def _band(value, good_pass, good_warn) -> str:
    """'pass' when good_pass(value), 'warn' when good_warn(value), else 'fail' (None fails)."""
    if value is None:
        return "fail"
    return "pass" if good_pass(value) else "warn" if good_warn(value) else "fail"


def checks(conv: dict, field: dict, health: dict, d: DiagnoseConfig, proj: dict | None = None) -> list[dict]:
    """Every check (R-hat, ESS, E-BFMI, divergences, tree depth), each with its number, bands and verdict."""
    out = []

    def add(name, what, value, verdict, bands, where=None):
        out.append({"check": name, "what": what, "value": value, "verdict": verdict, "bands": bands,
                    **({"where": where} if where else {})})

    def worst(key, fn):
        vals = {k: v[key] for k, v in conv.items()}
        if any(v is None for v in vals.values()):
            k = next(k for k, v in vals.items() if v is None)
            return None, k
        k = fn(vals, key=vals.get)
        return vals[k], k

    v, k = worst("rhat", max)
    add("rhat", "largest rank-normalised split R-hat of the parameters", v,
        _band(v, lambda x: x < d.rhat_pass, lambda x: x < d.rhat_warn),
        f"pass < {d.rhat_pass}, warn < {d.rhat_warn}", k)
    for which in ("ess_bulk", "ess_tail"):
        v, k = worst(which, min)
        add(which, f"smallest {which.split('_')[1]} ESS of the parameters", v,
            _band(v, lambda x: x > d.ess_pass, lambda x: x > d.ess_warn), f"pass > {d.ess_pass:g}, "
            f"warn > {d.ess_warn:g}", k)
    stuck = [f"{k} = {c['value']:.6g} in chain {c['chain']} ({c['draws']} draws)" for k, v in conv.items()
             for c in v.get("stuck", [])]
    add("stuck", "parameters that never move in a chain after warm-up (its ESS and R-hat are undefined)",
        len(stuck), "fail" if stuck else "pass", "pass none", "; ".join(stuck) or None)
    v = field["rhat_max"]
    add("field_rhat", "largest R-hat of the white noise's P(k) bins", v,
        _band(v, lambda x: x < d.rhat_pass, lambda x: x < d.rhat_warn), f"pass < {d.rhat_pass}, warn < {d.rhat_warn}")
    for which in ("ess_bulk", "ess_tail"):
        v = field[f"{which}_min"]
        add(f"field_{which}", f"smallest {which.split('_')[1]} ESS of the white noise's P(k) bins", v,
            _band(v, lambda x: x > d.ess_pass, lambda x: x > d.ess_warn),
            f"pass > {d.ess_pass:g}, warn > {d.ess_warn:g}")
    if proj is not None:  # the directions the data constrain, which P(k) does not see
        v = proj["rhat_max"]
        add("projection_rhat", f"largest R-hat of the field's {proj['count']} data-constrained projections", v,
            _band(v, lambda x: x < d.rhat_pass, lambda x: x < d.rhat_warn),
            f"pass < {d.rhat_pass}, warn < {d.rhat_warn}",
            None if proj["rhat_argmax"] is None else f"projection {proj['rhat_argmax']}")
        for which in ("ess_bulk", "ess_tail"):
            v = proj[f"{which}_min"]
            add(f"projection_{which}", f"smallest {which.split('_')[1]} ESS of the field's data-constrained "
                f"projections", v, _band(v, lambda x: x > d.ess_pass, lambda x: x > d.ess_warn),
                f"pass > {d.ess_pass:g}, warn > {d.ess_warn:g}")
    v = health["ebfmi_min"]
    worst_chain = None
    if v is not None:
        worst_chain = min(health["per_chain"], key=lambda p: p["ebfmi"])["run"]
    if all(p["kernel"].endswith("mclmc") for p in health["per_chain"]):
        add("ebfmi", "E-BFMI (MCLMC: not applicable, it has no Hamiltonian energy)", None, "n/a", "NUTS and HMC only")
    else:
        add("ebfmi", "smallest E-BFMI of the chains", v,
            _band(v, lambda x: x > d.bfmi_pass, lambda x: x > d.bfmi_warn), f"pass > {d.bfmi_pass}, "
            f"warn > {d.bfmi_warn}", worst_chain)
    if all(p["kernel"] == "mclmc" for p in health["per_chain"]):  # unadjusted: its bias grows with the error
        e = health.get("energy_error_ratio_max")
        worst = None if e is None else max(health["per_chain"], key=lambda p: p["energy_error_ratio"] or 0)
        add("energy_error", "largest ratio of a chain's energy-error variance per dimension to its target "
            "(MCLMC, inference.mclmc_energy_error)", e,
            _band(e, lambda x: x < d.energy_error_ratio_pass, lambda x: x < d.energy_error_ratio_warn),
            f"pass < {d.energy_error_ratio_pass:g}x, warn < {d.energy_error_ratio_warn:g}x the target",
            None if worst is None else f"{worst['run']}: {worst['energy_error_var_per_dim']:.3g} against "
                                       f"{worst['energy_error_target']:.3g}")
    frac = health["divergence_fraction"]
    add("divergences", f"divergences after warm-up ({health['divergences']} of {health['draws']} draws)", frac,
        _band(frac, lambda x: x == 0, lambda x: x < d.divergence_warn),
        f"pass none, warn < {100 * d.divergence_warn:g}% of the draws")
    v = health["tree_depth_saturation_max"]
    if v is None:
        add("tree_depth", "fraction of draws at max_tree_depth (not NUTS: not applicable)", None, "n/a", "NUTS only")
    else:
        per = health["per_chain"]
        uturn = max((p["max_depth_uturn"] or 0.0) for p in per)
        unrec = max((p["max_depth_unrecorded"] or 0.0) for p in per)
        add("tree_depth", "largest fraction of a chain's draws whose tree the depth cap ended (max_tree_depth "
            f"reached without a U-turn; U-turns at the last doubling, not counted: up to {100 * uturn:.1f}%"
            + (f"; with no record of why, counted as the cap: up to {100 * unrec:.1f}%" if unrec else "") + ")", v,
            _band(v, lambda x: x < d.tree_depth_pass, lambda x: x < d.tree_depth_warn),
            f"pass < {100 * d.tree_depth_pass:g}%, warn < {100 * d.tree_depth_warn:g}%")
    return out


def overall(items: list[dict]) -> str:
    vs = [c["verdict"] for c in items if c["verdict"] in VERDICTS]
    return max(vs, key=VERDICTS.index) if vs else "pass"
