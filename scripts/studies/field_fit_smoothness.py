#!/usr/bin/env python
"""Is the potential smooth where a field MAP ends? The directional derivative of U along a line
through the end of a fit, for each forward, side by side.

MUSE's field fits (fli/infer/muse/estimator.py) on the PM forward end at their step budget with the
gradient's RMS stalled at 0.01-0.04 per cell, in float32 and in float64 (docs/muse_studies.md). For a
smooth U the optimiser would drive the gradient to zero. Here the data's field is fitted at
fixed theta (``--steps`` L-BFGS steps from zero, MUSE's own solver), and then, along the unit
direction ``d`` of steepest descent there, ``phi'(t) = grad U(s + t d) . d`` is evaluated at
``--points`` values of t in each ``[-span, span]``. For a smooth U, phi' is a straight line over a
small span (the residual of a quadratic fit is round-off); a jump in phi' is a kink in U, and a
minimum on a kink is where no gradient method brings the gradient to zero.

``--assignments cic tsc`` repeats the PM forward with each mass assignment (simulation.assignment):
CIC's derivative jumps where a particle crosses a grid point, TSC's is continuous.

    python -m scripts.studies.field_fit_smoothness --mock <fli-mock run> --json out.json --figure out.png -- \\
        experiment=tiny survey.sigma_e=0.05 simulation.dtype=float64
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

from scripts.studies.study import emit  # noqa: E402

FORWARDS = ("pm", "linear")


def line(post, data, theta, s, spans, points):
    """phi'(t) along the steepest-descent direction at ``s``, for each span."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from fli.infer.posterior.model import Latents  # noqa: PLC0415

    grad = jax.jit(jax.grad(lambda s_: post.potential(Latents(theta, s_), data)))
    g0 = grad(s)
    d = -g0 / jnp.linalg.norm(g0)
    dphi = jax.jit(lambda t: jnp.vdot(grad(s + t * d), d))
    out = {}
    for span in spans:
        ts = np.linspace(-span, span, points)
        v = np.array([float(dphi(t)) for t in ts])
        resid = v - np.polyval(np.polyfit(ts, v, 2), ts)
        jumps = np.abs(np.diff(v))
        out[f"{span:g}"] = {"t": ts.tolist(), "dphi": v.tolist(), "quadratic_fit_residual_rms": float(np.sqrt(np.mean(
            resid ** 2))), "largest_jump": float(jumps.max()), "median_jump": float(np.median(jumps))}
    return out


def figure(res: dict, path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    spans = list(next(iter(res.values()))["lines"])
    fig, axes = plt.subplots(len(res), len(spans), figsize=(3.6 * len(spans), 2.8 * len(res)), squeeze=False)
    for row, (fwd, r) in zip(axes, res.items(), strict=True):
        for ax, span in zip(row, spans, strict=True):
            ln = r["lines"][span]
            ax.plot(ln["t"], ln["dphi"], ".-", ms=3, lw=0.8)
            ax.axhline(0, color="0.6", lw=0.5)
            ax.set_title(f"{fwd}: t in +-{span}", fontsize=9)
            ax.set_xlabel("t (along the descent direction)", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
            ax.xaxis.get_offset_text().set_fontsize(7)
        row[0].set_ylabel("phi'(t) = grad U . d", fontsize=8)
    fig.suptitle("U along a line through the end of a field fit: a straight phi' is smooth, a jump a kink", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mock", required=True, help="a fli-mock run directory")
    ap.add_argument("--forwards", nargs="+", default=list(FORWARDS), choices=FORWARDS)
    ap.add_argument("--assignments", nargs="+", default=["cic"], choices=["cic", "tsc"],
                    help="the PM forward's mass assignments to probe, each in turn (the linear forward has none)")
    ap.add_argument("--steps", type=int, default=1000, help="the fit's L-BFGS steps from zero")
    ap.add_argument("--theta", type=float, nargs="+", help="standardised theta (default: the prior's median)")
    ap.add_argument("--spans", type=float, nargs="+", default=[1e-1, 1e-2, 1e-3])
    ap.add_argument("--points", type=int, default=41)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--figure", type=Path)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)

    import jax.numpy as jnp  # noqa: PLC0415

    from fli.cli.common import _setup_process  # noqa: PLC0415
    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.infer.muse.field_fit import FieldSolver  # noqa: PLC0415
    from fli.infer.posterior.setup import prepare  # noqa: PLC0415

    log = logging.getLogger("fli")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    res = {}
    runs = [(f, m) for f in a.forwards for m in (a.assignments if f == "pm" else ["cic"])]
    for fwd, scheme in runs:
        cfg, _ = compose([*a.overrides, f"mock={a.mock}", f"simulation.forward={fwd}",
                          f"simulation.assignment={scheme}"])
        label = fwd if fwd == "linear" or len(a.assignments) == 1 and scheme == "cic" else f"{fwd}, {scheme}"
        _setup_process(cfg)  # as the commands do: x64 for simulation.dtype=float64
        _, post, data = prepare(cfg, log, compare_truth=False)
        theta = np.zeros(post.prior.n) if a.theta is None else np.asarray(a.theta)
        theta = jnp.asarray(theta, post.fwd.grid.jdtype)
        s, steps, gn, ev = FieldSolver(post, cfg.inference.map, a.steps, 0.0)(theta, post.zeros().s, data)
        lines = line(post, data, theta, s, a.spans, a.points)
        res[label] = {"fit_steps": steps, "fit_grad_evals": ev, "fit_grad_rms": gn, "lines": lines}
        for span, ln in lines.items():
            log.info("%s: fit gradient RMS %.3g after %d steps; over +-%s phi' has a quadratic-fit residual of "
                     "%.3g and its largest jump between points is %.3g (median %.3g)", label, gn, steps, span,
                     ln["quadratic_fit_residual_rms"], ln["largest_jump"], ln["median_jump"])
    out = {"mock": str(a.mock), "overrides": a.overrides, "steps": a.steps, "by_forward": res}
    if a.figure:
        figure(res, a.figure)
    emit(out, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
