"""``fli-diagnose``'s work: read the chains of fli-sample/fli-nuts runs, combine them, ArviZ's
diagnostics, verdicts.

The chains are read from the complete chunks of each run (``chunks/chunk_<i>`` with its
``DONE`` file, :func:`fli.infer.run_store.complete_chunks`), so a chain still sampling can be read
at any moment: a chunk being written (``chunks/.chunk_<i>.tmp``) is not looked at. Every
number comes from ArviZ 0.23's own functions on one InferenceData of the chains, truncated to
the shortest chain's post-warm-up draws:

* convergence: ``az.rhat`` (rank-normalised split R-hat), ``az.ess`` (bulk, tail),
  ``az.mcse`` (of the mean and of the standard deviation), per parameter (the sampled ones,
  ``Omega_m``, ``S8``), and the same per bin of the white noise's power spectrum of the draws
  (``field_summaries.pk_white_noise``), reported as their minimum and harmonic mean (not
  Vats' multivariate ESS, another quantity);
* sampler health: divergences after warm-up, ``az.bfmi`` (E-BFMI) per chain, the fraction of
  draws whose tree the run's ``inference.max_tree_depth`` cut short (NUTS: the tree reached
  that depth without a U-turn; a U-turn at the last doubling is told apart by the ``turning``
  statistic the kernel records), step size and acceptance per chain;
* efficiency: ESS per 1000 gradient evaluations and per hour of sampling, both summed over
  the chains' post-warm-up draws that were used (cumulative ``gradient_evals`` and ``seconds``
  of ``stats.npz``).

Each check has pass/warn bands (:class:`fli.config.DiagnoseConfig`); the overall verdict is the
worst check. Outputs (:func:`run_diagnose`): ``diagnostics.json``, ``chains.nc`` (the combined
InferenceData), figures and ``report.html`` (:mod:`fli.infer.diagnose_report`). Reading,
checking and combining the runs' chains is :mod:`fli.infer.diagnose_runs`'s.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from fli.config import DiagnoseConfig
from fli.files import write_json
from fli.infer.diagnose_convergence import convergence, field_convergence, projection_convergence
from fli.infer.diagnose_runs import Chain, chain_table, combine, find_runs, load
from fli.infer.diagnose_sampler import sampler_health
from fli.infer.inference_data import quiet_arviz
from fli.infer.params import names_of_run
from fli.manifest import check_kind, write_manifest

DIAGNOSTICS_JSON = "diagnostics.json"
CHAINS_NC = "chains.nc"
VERDICTS = ("pass", "warn", "fail")
# exit statuses: a verdict's, apart from bad input's 2 (every fli command's) and a crash's 1
EXIT_STATUS = {"pass": 0, "warn": 3, "fail": 4}
BAD_INPUT = 2


# ================================================================ numbers and verdicts


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


def diagnose_chains(chains: list[Chain], dcfg: DiagnoseConfig) -> tuple[dict, object]:
    """Every number and verdict of the chains (already consistent); returns (report, idata)."""
    idata = combine(chains)
    n = int(idata.posterior.sizes["draw"])
    names = names_of_run(chains[0].config)
    conv = convergence(idata, names)
    field = field_convergence(idata)
    proj = projection_convergence(idata)
    health = sampler_health(idata, chains)
    items = checks(conv, field, health, dcfg, proj)
    report = {"verdict": overall(items), "exit_status": EXIT_STATUS[overall(items)], "checks": items,
              "chains": len(chains), "draws_per_chain": n, "params": conv, "field": field, "projections": proj,
              "sampler": health,
              "efficiency": efficiency(conv, chains, n), "thresholds": dataclasses.asdict(dcfg)}
    return report, idata


# ================================================================ the command


def run_diagnose(cfg, resolved: dict, run_dir: Path, log: logging.Logger) -> dict:
    """Diagnose ``cfg.runs`` or ``cfg.sweep`` into ``run_dir``; returns the report (the content
    of ``diagnostics.json``). Bad input raises ConfigError before anything is written."""
    run_dir = Path(run_dir)
    check_kind(run_dir, "fli-diagnose")
    runs = find_runs(list(cfg.runs) if cfg.runs else None, cfg.sweep)
    chains, dropped = load(runs)
    for d in dropped:
        log.warning("dropped %s: %s", d["run"], d["reason"])
    notes: list[str] = []
    if cfg.diagnose.figures:  # the truth is read (and a named mock= checked) before anything is written
        from fli.infer.diagnose_fields import truth_of  # noqa: PLC0415

        obs = truth_of(chains[0].config, notes, chains[0].observation, cfg.mock)
    report, idata = diagnose_chains(chains, cfg.diagnose)
    n = report["draws_per_chain"]
    report["runs"] = chain_table(chains, n)
    report["dropped"] = dropped
    if len({c.n_post for c in chains}) > 1:
        log.warning("chains of unequal length (%s post-warm-up draws): the first %d of each are used",
                    ", ".join(str(c.n_post) for c in chains), n)
    run_dir.mkdir(parents=True, exist_ok=True)
    with quiet_arviz():
        idata.to_netcdf(str(run_dir / CHAINS_NC), engine="h5netcdf")
    report["inference_data"] = str(run_dir / CHAINS_NC)
    if cfg.diagnose.figures:
        from fli.infer.diagnose_fields import figure_data  # noqa: PLC0415
        from fli.infer.diagnose_figures import figures  # noqa: PLC0415

        data = figure_data(idata, chains, cfg.diagnose, notes, obs)
        report["figures"], report["figure_notes"] = figures(
            idata, chains, data, run_dir, log, notes, cfg.diagnose.energy_error_ratio_pass), notes
    else:
        report["figures"], report["figure_notes"] = {}, ["diagnose.figures=false"]
    write_json(run_dir / DIAGNOSTICS_JSON, report)
    write_manifest(run_dir, "fli-diagnose", resolved)
    from fli.infer.diagnose_report import write_html  # noqa: PLC0415

    write_html(report, run_dir)
    print(summary_table(report))
    return report


def _fmt(x, spec=".3g") -> str:
    """``x`` formatted; a missing value is a dash right-aligned to the spec's width."""
    if x is not None:
        return format(x, spec)
    width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
    return "-".rjust(int(width)) if width else "-"


def summary_table(report: dict) -> str:
    """One screen: the chains, the parameters and the checks, with the overall verdict."""
    lines = [f"fli-diagnose: {report['chains']} chain(s), {report['draws_per_chain']} post-warm-up draws each"]
    for r in report.get("runs", []):
        note = f"  [{'; '.join(r['notes'])}]" if r["notes"] else ""
        lines.append(f"  {r['run']}: {r['post_warmup_draws']} draws after {r['warmup_draws']} warm-up, "
                     f"{r['used']} used{note}")
    for d in report.get("dropped", []):
        lines.append(f"  dropped {d['run']}: {d['reason']}")
    eff = report["efficiency"]["params"]
    lines.append(f"  {'param':<9}{'mean':>10}{'sd':>10}{'R-hat':>8}{'ESS bulk':>10}{'ESS tail':>10}"
                 f"{'MCSE':>10}{'ESS/1k grad':>12}{'ESS/h':>10}")
    for k, v in report["params"].items():
        lines.append(f"  {k:<9}{_fmt(v['mean'], '10.4g')}{_fmt(v['sd'], '10.3g')}{_fmt(v['rhat'], '8.3f')}"
                     f"{_fmt(v['ess_bulk'], '10.0f')}{_fmt(v['ess_tail'], '10.0f')}{_fmt(v['mcse_mean'], '10.2g')}"
                     f"{_fmt(eff[k]['ess_bulk_per_1000_grads'], '12.3g')}{_fmt(eff[k]['ess_bulk_per_hour'], '10.3g')}")
    f = report["field"]
    lines.append(f"  field P(k), {len(f['k'])} bins: ESS bulk min {_fmt(f['ess_bulk_min'], '.0f')}, harmonic mean "
                 f"{_fmt(f['ess_bulk_harmonic_mean'], '.0f')}; R-hat max {_fmt(f['rhat_max'], '.3f')}")
    for c in report["checks"]:
        v = c["value"]
        val = "-" if v is None else (f"{100 * v:.2f}%" if c["check"] in ("divergences", "tree_depth") else f"{v:.4g}")
        at = f" [{c['where']}]" if c.get("where") and c["verdict"] == "fail" else ""
        lines.append(f"  {c['verdict'].upper():<5} {c['check']:<20}{val:>10}  ({c['bands']}){at}")
    lines.append(f"verdict: {report['verdict'].upper()} (exit status {report['exit_status']})")
    return "\n".join(lines)
