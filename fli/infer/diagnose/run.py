"""``fli-diagnose``'s work: read the chains of fli-sample/fli-nuts runs, combine them, ArviZ's
diagnostics, verdicts.

The chains are read from the complete chunks of each run (``chunks/chunk_<i>`` with its
``DONE`` file, :func:`fli.infer.sample.run_store.complete_chunks`), so a chain still sampling can be read
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
worst check. Beside them, the parameters' estimates (:mod:`fli.infer.diagnose.estimates`): the
posterior's against the prior, the truth, and the MAP and MUSE of a fli-map start. Outputs (:func:`run_diagnose`): ``diagnostics.json``, ``chains.nc`` (the combined
InferenceData), figures and ``report.html`` (:mod:`fli.infer.diagnose.report`). Reading,
checking and combining the runs' chains is :mod:`fli.infer.diagnose.chains`'s.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from fli.config import DiagnoseConfig
from fli.store.files import write_json
from fli.infer.diagnose.convergence import convergence, field_convergence, projection_convergence
from fli.infer.diagnose.chains import Chain, chain_table, combine, find_runs, load
from fli.infer.diagnose.checks import EXIT_STATUS, checks, efficiency, overall
from fli.infer.diagnose.estimates import estimates
from fli.infer.diagnose.sampler import sampler_health
from fli.infer.sample.inference_data import quiet_arviz
from fli.infer.posterior.params import names_of_run
from fli.store.manifest import check_kind, write_manifest

DIAGNOSTICS_JSON = "diagnostics.json"
CHAINS_NC = "chains.nc"


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
        from fli.infer.diagnose.fields import truth_of  # noqa: PLC0415

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
        from fli.infer.diagnose.fields import figure_data  # noqa: PLC0415
        from fli.infer.diagnose.figures import figures  # noqa: PLC0415

        data = figure_data(idata, chains, cfg.diagnose, notes, obs)
        report["figures"], report["figure_notes"] = figures(
            idata, chains, data, run_dir, log, notes, cfg.diagnose.energy_error_ratio_pass), notes
    else:
        data = {}
        report["figures"], report["figure_notes"] = {}, ["diagnose.figures=false"]
    report["estimates"] = estimates(idata, [k for k in report["params"] if k != "Omega_m"], data)
    report["config"] = chains[0].config
    write_json(run_dir / DIAGNOSTICS_JSON, report)
    write_manifest(run_dir, "fli-diagnose", resolved)
    from fli.infer.diagnose.report import write_html  # noqa: PLC0415

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
