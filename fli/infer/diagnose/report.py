"""``report.html`` of ``fli-diagnose``: one self-contained page (figures as base64 PNG, inline
CSS, no script and no external resource), readable offline."""

from __future__ import annotations

import base64
import html
from pathlib import Path

REPORT_HTML = "report.html"
_COLOURS = {"pass": "#1a7f37", "warn": "#b08800", "fail": "#cf222e", "n/a": "#57606a"}
_CSS = """body{font-family:sans-serif;margin:1.5em auto;max-width:1100px;color:#1f2328}
table{border-collapse:collapse;margin:0.6em 0}td,th{border:1px solid #d0d7de;padding:3px 8px;font-size:13px}
th{background:#f6f8fa}td.num{text-align:right;font-family:monospace}.badge{color:#fff;padding:2px 8px;
border-radius:4px;font-weight:bold}img{max-width:min(100%,900px);border:1px solid #eee;margin:0.3em 0}
figure{margin:1em 0}figcaption{font-size:13px;color:#57606a}
pre{font-size:12px;background:#f6f8fa;padding:0.6em;overflow-x:auto}"""
CAPTIONS = {
    "trace": "Trace and marginal of each parameter per chain (divergences marked at the bottom).",
    "rank": "Rank plots: uniform histograms when the chains mix.",
    "projections": "The field's data-constrained projections (the top eigenvectors of J^T J, largest first) per "
                   "chain: what a chain must move in the directions the data fix.",
    "pair": "Pairs of the parameters; divergences in orange, the mock's truth as a cross.",
    "corner": "The parameters' posterior (blue; divergent draws in orange) over their prior (grey), with the truth "
              "(red, dashed), the joint MAP (orange) and MUSE's Gaussian (green: 68 % and 95 % contours) of the "
              "fli-map run the chains started from, where there are.",
    "maps": "The observed convergence per bin, the posterior's mean prediction of it, and their difference in units "
            "of the noise.",
    "energy": "Energy: marginal energy against the energy transitions (E-BFMI per chain).",
    "energy_error": "MCLMC's energy error per transition over sqrt(dimension), with a normal of the pass band's "
                    "variance.",
    "s8_prior": "Posterior of S8 with its prior (sampled through PriorTransform).",
    "field_pk": "White noise of the draws: P(k) over the prior expectation (the cell volume).",
    "field_slices": "Initial white noise: posterior mean and sd (running.zarr), slice y = Ly/2, beside the truth.",
    "r_k": "r(k) and T(k) of the posterior-mean white noise with the truth.",
    "mass_maps": "Posterior mass maps: mean and sd of the noiseless kappa per bin, beside the truth.",
    "residuals": "Posterior-predictive residuals of thinned draws in units of the noise, with chi2 per pixel.",
}


def _badge(v: str) -> str:
    return f'<span class="badge" style="background:{_COLOURS.get(v, "#57606a")}">{html.escape(v.upper())}</span>'


def _n(x, spec=".4g") -> str:
    return "&ndash;" if x is None else format(x, spec)


def _value(c: dict) -> str:
    v = c["value"]
    if v is not None and c["check"] in ("divergences", "tree_depth"):  # fractions, shown as their bands are
        return f"{100 * v:.2f}%"
    return _n(v)


def _table(head: list[str], rows: list[list[str]], num_from: int = 1) -> str:
    h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i >= num_from else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def _estimates(rows: list[dict]) -> str:
    e = html.escape

    def pm(v, sd):
        return "&ndash;" if v is None else _n(v) + ("" if sd is None else f" &plusmn; {_n(sd, '.2g')}")

    def held(r):
        return "&ndash;" if r["truth_in_interval99"] is None else ("yes" if r["truth_in_interval99"] else
                                                                  '<b style="color:#cf222e">no</b>')

    return _table(["param", "prior (95 %)", "truth", "MAP ± Laplace sd", "MUSE ± sd",
                   "posterior mean ± sd", "posterior 99 %", "truth inside", "posterior sd / prior sd"],
                  [[e(r["param"]), "&ndash;" if r["prior95"] is None else f"{_n(r['prior95'][0])} &ndash; "
                    f"{_n(r['prior95'][1])}", _n(r["truth"]), pm(r["map"], r["map_laplace_sd"]),
                    pm(r["muse"], r["muse_sd"]), pm(r["mean"], r["sd"]),
                    f"{_n(r['interval99'][0])} &ndash; {_n(r['interval99'][1])}", held(r),
                    _n(r["sd_over_prior_sd"], ".2f")] for r in rows])


def _stages(stages: dict) -> str:
    e = html.escape
    return _table(["stage", "this start", "seconds", "gradient evaluations (the run's, in all)"],
                  [[e(k), e(v["status"]), _n(v.get("seconds"), ".1f"), _n(v.get("gradient_evals"), ".0f")]
                   for k, v in stages.items()])


# the figures each section of the page shows, in order; any other goes to the last section
SECTIONS = {"observation": ("maps", "mass_maps", "residuals"),
            "parameters": ("corner", "s8_prior"),
            "field": ("field_slices", "r_k", "field_pk", "projections"),
            "chains": ("trace", "warmup_trace", "rank", "pair", "energy", "energy_error")}


def render(report: dict, run_dir: Path) -> str:
    """The page: what was run and what it cost, the parameters (estimates, corner), the
    observation and its prediction, the field, every check's verdict, the chains, the config."""
    e = html.escape
    figs = dict(report.get("figures", {}))

    def figures(names) -> str:
        out = []
        for name in names:
            if name not in figs:
                continue
            data = base64.b64encode(Path(figs.pop(name)).read_bytes()).decode("ascii")
            out.append(f'<figure id="{e(name)}"><img alt="{e(name)}" src="data:image/png;base64,{data}">'
                       f"<figcaption>{e(CAPTIONS.get(name, name))}</figcaption></figure>")
        return "".join(out)

    bad = [c["check"] for c in report["checks"] if c["verdict"] in ("warn", "fail")]
    parts = [f"<h1>{e(report.get('title', 'fli-diagnose'))} {_badge(report['verdict'])}</h1>",
             f"<p>{report['chains']} chain(s), {report['draws_per_chain']} post-warm-up draws each; exit status "
             f"{report['exit_status']} (0 pass, 3 warn, 4 fail; 2 is bad input, with no report)."
             + (f" Checks not passed: {e(', '.join(bad))}." if bad else " Every check passed.") + "</p>"]
    if report.get("stages"):
        parts += ["<h2>Stages and their cost</h2>", _stages(report["stages"])]
    parts.append("<h2>Parameters</h2>")
    if report.get("estimates"):
        parts.append(_estimates(report["estimates"]))
    parts.append(figures(SECTIONS["parameters"]))
    eff = report["efficiency"]["params"]
    parts.append(_table(["param", "mean", "sd", "R-hat", "ESS bulk", "ESS tail", "MCSE mean", "MCSE sd",
                         "ESS bulk / 1000 grads", "ESS bulk / hour"],
                        [[e(k), _n(v["mean"]), _n(v["sd"], ".3g"), _n(v["rhat"], ".4f"), _n(v["ess_bulk"], ".0f"),
                          _n(v["ess_tail"], ".0f"), _n(v["mcse_mean"], ".2g"), _n(v["mcse_sd"], ".2g"),
                          _n(eff[k]["ess_bulk_per_1000_grads"], ".3g"), _n(eff[k]["ess_bulk_per_hour"], ".3g")]
                         for k, v in report["params"].items()]))
    if any(n in figs for n in SECTIONS["observation"]):
        parts += ["<h2>The observation and the posterior's prediction</h2>", figures(SECTIONS["observation"])]
    f = report["field"]
    parts.append("<h2>The field</h2>")
    parts.append(f"<p>{len(f['k'])} P(k) bins of the white noise; bulk ESS min {_n(f['ess_bulk_min'], '.0f')}, "
                 f"harmonic mean {_n(f['ess_bulk_harmonic_mean'], '.0f')}; tail ESS min {_n(f['ess_tail_min'], '.0f')},"
                 f" harmonic mean {_n(f['ess_tail_harmonic_mean'], '.0f')}; R-hat max {_n(f['rhat_max'], '.4f')}. "
                 f"Efficiency: {e(report['efficiency']['note'])}.</p>")
    parts.append(figures(SECTIONS["field"]))
    parts.append("<h2>Checks</h2>")
    parts.append(_table(["check", "what", "value", "verdict", "bands"],
                        [[e(c["check"]), e(c["what"] + (f" [{c['where']}]" if c.get("where") else "")),
                          _value(c), _badge(c["verdict"]), e(c["bands"])] for c in report["checks"]], 2))
    parts.append("<h2>Chains</h2>")
    parts.append(_table(["run", "chunks", "warm-up", "post-warm-up", "used", "notes"],
                        [[e(r["run"]), str(r["chunks"]), str(r["warmup_draws"]), str(r["post_warmup_draws"]),
                          str(r["used"]), e("; ".join(r["notes"]))] for r in report.get("runs", [])]))
    if report.get("dropped"):
        parts.append("<p>Dropped:</p><ul>" + "".join(f"<li>{e(d['run'])}: {e(d['reason'])}</li>"
                                                     for d in report["dropped"]) + "</ul>")
    sh = report["sampler"]["per_chain"]
    parts.append(_table(["run", "divergences", "E-BFMI", "ended by the depth cap", "mean tree depth", "step size",
                         "acceptance"],
                        [[e(p["run"]), str(p["divergences"]), _n(p["ebfmi"], ".3f"),
                          _n(None if p["tree_depth_saturation"] is None else 100 * p["tree_depth_saturation"], ".1f")
                          + ("%" if p["tree_depth_saturation"] is not None else ""),
                          _n(p["mean_tree_depth"], ".2f"), _n(p["step_size"], ".3g"), _n(p["acceptance"], ".3f")]
                         for p in sh]))
    parts.append(figures(SECTIONS["chains"]))
    parts.append(figures(list(figs)))  # any figure no section names
    if report.get("figure_notes"):
        parts.append("<p>Notes on the figures:</p><ul>" + "".join(f"<li>{e(n)}</li>" for n in report["figure_notes"])
                     + "</ul>")
    if report.get("config"):
        import yaml  # noqa: PLC0415

        parts.append("<h2>Configuration</h2><details><summary>The chains' resolved config (config.yaml of "
                     f"{e(str(report['runs'][0]['run']) if report.get('runs') else 'the first run')})</summary><pre>"
                     + e(yaml.safe_dump(report["config"], sort_keys=False)) + "</pre></details>")
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>fli-diagnose: "
            f"{e(report['verdict'])}</title><style>{_CSS}</style></head><body>{''.join(parts)}</body></html>")


def write_html(report: dict, run_dir: Path) -> Path:
    path = Path(run_dir) / REPORT_HTML
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render(report, run_dir))
    tmp.rename(path)
    return path
