#!/usr/bin/env python
"""Whether MUSE's H depends on where each refit starts: warm (MUSE's way, from the simulation's
own MAP at theta) or cold (from a zero field), and on the finite-difference step.

Why: the score g(theta, x) is the joint likelihood's score at the field's MAP s_hat(theta, x),
and H must be the derivative of its *expectation* over data drawn at theta'. With common random
numbers, the mean over simulations of [g(x_k(theta + d)) - g(x_k(theta - d))] / 2d is an unbiased
estimate of that expectation's secant slope whatever g is, provided g is a function of the data
alone. MUSE's refits (fli/infer/muse/estimator.py, ``finite_difference_h``) start from each simulation's MAP
at theta, so a fit landing in another local minimum from a cold start would make g depend on
the start. On tiny TSC, MUSE's H for sigma8 with its J gives a precision H^2 / J over 3x what the
NUTS chains find (docs/muse_studies.md), where Cauchy-Schwarz bounds H^2 / J by the Fisher information.

For each simulation k of ``--sims`` (MUSE's own keys, ``Muse.sim_key``): the cold fit at theta,
then for every ``--deltas`` d and every column j of ``--columns`` the fits of x_k(theta +- d e_j)
at theta, cold and warm. Each fit's score is appended to ``--out`` as it is made (a stopped run
resumes there, and several processes can share the sims by giving each its own file).
``--report`` reads every given file and prints the H columns with their Monte Carlo errors, J at
theta, the paired warm-minus-cold differences, the secant's change with the step, and the mean
score's response curve: the paired change of the cold scores from theta to every shift, with the
scores' sd there (``--starts cold`` with large ``--deltas`` asks whether the mean score stays
linear over the chains' range):

    nice -n 19 python -m scripts.studies.muse_h_start --mock <mock> --theta -0.835 -0.023 --sims 0 8 \\
        --out /work/studies/h_start/a.jsonl -- experiment=tiny survey.sigma_e=0.05 simulation.assignment=tsc
    python -m scripts.studies.muse_h_start --report /work/studies/h_start/*.jsonl --json docs/bench/muse_h_start_tiny_tsc.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from scripts.studies.study import emit  # noqa: E402


def _name(k: int, start: str, j: int, sign: int, d: float) -> str:
    return f"sim{k}/{start}/{j}{'+' if sign > 0 else '-'}{d:g}"


def _mean_se(x: np.ndarray) -> dict:
    """``{"n", "mean", "se"}`` of per-simulation rows ``x`` ``[k, n]``."""
    return {"n": len(x), "mean": x.mean(0).tolist(), "se": (x.std(0, ddof=1) / np.sqrt(len(x))).tolist()}


def fit(argv_ns) -> None:
    a = argv_ns
    from fli.cli.common import _setup_process  # noqa: PLC0415
    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.infer.posterior.setup import prepare  # noqa: PLC0415
    from fli.infer.muse.estimator import Muse  # noqa: PLC0415

    log = logging.getLogger("fli")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    cfg, _ = compose([*a.overrides, f"mock={a.mock}"])
    _setup_process(cfg)
    _, post, data = prepare(cfg, log, compare_truth=False)
    m = Muse(post, data, cfg.inference.map.muse, cfg.inference.map, seed=cfg.seed, log=log)
    theta = np.asarray(a.theta, np.float64)
    if theta.shape != (post.prior.n,):
        raise SystemExit(f"--theta: {post.prior.n} values, one per sampled parameter ({', '.join(post.names)})")
    done = {}
    if a.out.exists():
        for line in a.out.read_text().splitlines():
            r = json.loads(line)
            done[r["name"]] = r
    a.out.parent.mkdir(parents=True, exist_ok=True)
    th = m._dtype(theta)

    def one(name, theta_data, key_i, s0):
        if name in done:
            return None
        t0 = time.perf_counter()
        x = m.simulate(m._dtype(theta_data), m.sim_key(key_i), data)
        s, steps, gn, ev = m.solver(th, s0, x)
        g = np.asarray(m.score(th, s, x), np.float64)
        rec = {"name": name, "theta": theta.tolist(), "theta_data": np.asarray(theta_data).tolist(),
               "score": g.tolist(), "steps": steps, "grad_rms": gn, "evals": ev, "seconds": time.perf_counter() - t0}
        with a.out.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        log.info("%s: score %s, %d steps, %d evaluations, %.0f s", name, np.round(g, 4).tolist(), steps, ev,
                 rec["seconds"])
        return s

    for k in range(*a.sims):
        name0 = f"sim{k}/cold/at"
        if name0 in done and "warm" not in a.starts:
            s_at = None
        elif name0 in done:  # the warm refits need this field: make it again (deterministic) without a record
            x = m.simulate(th, m.sim_key(k), data)
            s_at = m.solver(th, m.zero, x)[0]
        else:
            s_at = one(name0, theta, k, m.zero)
        for d in a.deltas:
            for j in a.columns:
                for sign in (1, -1):
                    tp = theta.copy()
                    tp[j] += sign * d
                    if "cold" in a.starts:
                        one(_name(k, "cold", j, sign, d), tp, k, m.zero)
                    if "warm" in a.starts:
                        one(_name(k, "warm", j, sign, d), tp, k, s_at)


def report(files: list[Path], json_out: Path | None) -> None:
    recs = {}
    for f in files:
        for line in f.read_text().splitlines():
            r = json.loads(line)
            recs[r["name"]] = r
    sims = sorted({int(n.split("/")[0][3:]) for n in recs})
    g_at = np.asarray([recs[f"sim{k}/cold/at"]["score"] for k in sims if f"sim{k}/cold/at" in recs])
    secants: dict[int, dict[float, dict]] = {}
    out = {"n_sims_at_theta": len(g_at), "J": np.cov(g_at.T).tolist() if len(g_at) > 2 else None, "columns": {}}
    for j, d in sorted({(int(n.split("/")[2][0]), float(n.split("/")[2][2:])) for n in recs if not n.endswith("/at")}):
        row = {}
        cols = {}
        for start in ("cold", "warm"):
            ks = [k for k in sims if all(_name(k, start, j, s, d) in recs for s in (1, -1))]
            if len(ks) < 2:
                continue
            c = np.asarray([(np.asarray(recs[_name(k, start, j, 1, d)]["score"])
                             - np.asarray(recs[_name(k, start, j, -1, d)]["score"])) / (2 * d) for k in ks])
            cols[start] = dict(zip(ks, c, strict=True))
            stats = _mean_se(c)
            row[start] = {"n": stats["n"], "H_column": stats["mean"], "se": stats["se"],
                          "evals_mean": float(np.mean([recs[_name(k, start, j, s, d)]["evals"]
                                                       for k in ks for s in (1, -1)]))}
        if "cold" in cols and "warm" in cols:
            ks = sorted(set(cols["cold"]) & set(cols["warm"]))
            diff = np.asarray([cols["warm"][k] - cols["cold"][k] for k in ks])
            row["warm_minus_cold"] = {**_mean_se(diff), "per_sim": diff.tolist()}
        out["columns"][f"{j}@{d:g}"] = row
        secants.setdefault(j, {})[d] = cols.get("cold", {})
    for j, by_d in secants.items():  # is the mean score linear in theta'? the paired change of the secant with d
        ds = sorted(by_d)
        for d in ds[1:]:
            ks = sorted(set(by_d[ds[0]]) & set(by_d[d]))
            if len(ks) < 2:
                continue
            diff = np.asarray([by_d[d][k] - by_d[ds[0]][k] for k in ks])
            out["columns"][f"{j}@{d:g}"]["cold_minus_smallest_step"] = {"step": ds[0], **_mean_se(diff)}
    # the mean score's response curve: E[g(theta, x(theta + t e_j))] - E[g(theta, x(theta))], paired per
    # simulation, at every signed shift t of the cold fits (linear in t where H describes it)
    for j in sorted(secants):
        curve = {}
        for d in sorted(secants[j]):
            for sign in (-1, 1):
                ks = [k for k in sims if f"sim{k}/cold/at" in recs and _name(k, "cold", j, sign, d) in recs]
                if len(ks) < 2:
                    continue
                diff = np.asarray([np.asarray(recs[_name(k, "cold", j, sign, d)]["score"])
                                   - np.asarray(recs[f"sim{k}/cold/at"]["score"]) for k in ks])
                raw = np.asarray([recs[_name(k, "cold", j, sign, d)]["score"] for k in ks])
                curve[f"{sign * d:+g}"] = {**_mean_se(diff), "score_sd": raw.std(0, ddof=1).tolist()}  # sqrt(J) there
        out.setdefault("response", {})[str(j)] = dict(sorted(curve.items(), key=lambda kv: float(kv[0])))
        theta = next(iter(recs.values()))["theta"]
        out.setdefault("score_posterior", {})[str(j)] = score_posterior(theta[j], out["response"][str(j)],
                                                                        g_at[:, j].std(ddof=1), j)
    emit(out, json_out)


def score_posterior(theta_j: float, curve: dict, sd_at: float, j: int, offset: float = 0.0) -> dict | None:
    """The posterior of the latent ``theta_j`` given only the data's score component j, the other
    parameters held: the standard-normal prior times that score's Gaussian at each ``theta_j``,
    its mean and sd interpolated in the response curve (``sd_at`` at theta itself, where the
    response is 0). ``offset``: the data's score minus the simulations' mean at theta, 0 at
    MUSE's root. Over the curve's range only: None without a shift on each side."""
    ts = sorted(float(k) for k in curve)
    if not (ts[0] < 0 < ts[-1]):
        return None
    grid = sorted([*ts, 0.0])
    means = [0.0 if x == 0.0 else curve[f"{x:+g}"]["mean"][j] for x in grid]
    sds = [sd_at if x == 0.0 else curve[f"{x:+g}"]["score_sd"][j] for x in grid]
    z = np.linspace(theta_j + grid[0], theta_j + grid[-1], 4001)
    mu, v = np.interp(z - theta_j, grid, means), np.interp(z - theta_j, grid, sds)
    logw = -0.5 * z**2 - 0.5 * ((offset - mu) / v) ** 2 - np.log(v)
    w = np.exp(logw - logw.max())
    w /= w.sum()
    mean = float((w * z).sum())
    cdf = np.cumsum(w)
    return {"mean": mean, "sd": float(np.sqrt((w * (z - mean) ** 2).sum())), "range": [float(z[0]), float(z[-1])],
            "q025_q975": [float(np.interp(0.025, cdf, z)), float(np.interp(0.975, cdf, z))],
            "mass_in_outer_percent": float(w[:40].sum() + w[-40:].sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mock", help="a fli-mock run directory")
    ap.add_argument("--theta", type=float, nargs="+", help="the standardised theta (map.json's muse.theta_z)")
    ap.add_argument("--sims", type=int, nargs=2, default=[0, 16], metavar=("FIRST", "STOP"))
    ap.add_argument("--deltas", type=float, nargs="*", default=[0.2, 0.5],
                    help="the shifts (none: only the fits at theta, for J)")
    ap.add_argument("--starts", nargs="+", choices=("cold", "warm"), default=["cold", "warm"],
                    help="where the shifted fits start: a zero field, the simulation's MAP at theta, or both")
    ap.add_argument("--columns", type=int, nargs="+", default=[1], help="the H columns (parameter indices) to take")
    ap.add_argument("--out", type=Path, help="the JSON-lines file the fits' scores are appended to")
    ap.add_argument("--report", type=Path, nargs="+", help="summarise these JSON-lines files instead of fitting")
    ap.add_argument("--json", type=Path)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    if a.report:
        report(a.report, a.json)
        return 0
    if not (a.mock and a.theta and a.out):
        ap.error("--mock, --theta and --out are needed to fit (or --report)")
    fit(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
