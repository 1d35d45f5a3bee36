#!/usr/bin/env python
"""The exact posterior of the cosmological parameters of a linear-forward mock, on a grid.

    fli-mock experiment=tiny simulation.forward=linear run_dir=/tmp/linmock
    python -m scripts.studies.exact_posterior --out /tmp/exact -- experiment=tiny simulation.forward=linear \\
        mock=/tmp/linmock distributed.pdims=[1,1]

Hydra overrides after ``--`` compose the analysis's config, as fli-map's do (the forward must be
linear: fli/infer/posterior/exact.py). Two passes of :func:`fli.infer.posterior.exact.grid_posterior`: a coarse grid
over the prior (``--span`` sd of each standardised latent), then a fine one over the first
pass's mean +- ``--width`` of its sd. Writes into ``--out``:

* ``exact_posterior.json``: the means and sds of the physical parameters (S8 and Omega_m
  included), the truth where the mock has one, the grids, each pass's edge mass and seconds;
* ``exact_posterior.npz``: the fine pass's log mass and physical parameters on its grid;
* ``exact_posterior.png``: the fine pass's 68% and 95% contours in the first two parameters,
  and the cumulative marginal of S8.

Cost: one Jacobian of the residual in the field (a VJP per pixel of every bin) per grid point.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path



def _hpd_levels(w, masses=(0.68, 0.95)):
    """The density thresholds that enclose ``masses`` of the grid's weights."""
    import numpy as np

    flat = np.sort(w.ravel())[::-1]
    cum = np.cumsum(flat)
    return [float(flat[min(np.searchsorted(cum, m), flat.size - 1)]) for m in masses]


def refined(g, refine: int = 8):
    """``(physical, weights)`` of a 2D grid with each cell cut ``refine``-fold per axis: log mass
    (cubic where the grid allows) and every physical parameter (linear) interpolated in the
    latents, the weights normalised.
    A 15-point grid draws contours as polygons, and its cells' cumulative sum jumps by a whole
    cell's mass (up to a fifth of it); other grids come back as they are."""
    import numpy as np

    if g.log_p.ndim != 2 or refine <= 1:
        return g.physical, g.weights
    from scipy.interpolate import RegularGridInterpolator

    fine = [np.linspace(a[0], a[-1], (len(a) - 1) * refine + 1) for a in g.axes]
    pts = np.stack(np.meshgrid(*fine, indexing="ij"), axis=-1)
    cubic = min(len(a) for a in g.axes) >= 4  # scipy's cubic needs 4 points an axis
    lp = RegularGridInterpolator(g.axes, g.log_p, method="cubic" if cubic else "linear")(pts)
    w = np.exp(lp - lp.max())
    return {k: RegularGridInterpolator(g.axes, v)(pts) for k, v in g.physical.items()}, w / w.sum()


def s8_cdf(g, refine: int = 8):
    """S8's cumulative marginal ``(s8, cdf)``, sorted, on the :func:`refined` grid (a histogram
    of the cells would alias: spikes where several cells fall into one bin)."""
    import numpy as np

    phys, w = refined(g, refine)
    order = np.argsort(phys["S8"].ravel())
    return phys["S8"].ravel()[order], np.cumsum(w.ravel()[order])


def _figure(g, truth, path):
    from fli.plots import pyplot, save_figure

    plt = pyplot()
    phys, w = refined(g)
    names = g.names
    fig, (ax, axm) = plt.subplots(1, 2, figsize=(9, 3.8), constrained_layout=True)
    if len(names) >= 2:
        x, y = phys[names[0]], phys[names[1]]
        w2 = w.sum(axis=tuple(range(2, w.ndim))) if w.ndim > 2 else w
        x2 = x[(...,) + (0,) * (w.ndim - 2)] if w.ndim > 2 else x
        y2 = y[(...,) + (0,) * (w.ndim - 2)] if w.ndim > 2 else y
        levels = sorted(set(_hpd_levels(w2)))
        ax.contour(x2, y2, w2, levels=levels + [w2.max() * 1.0001], colors=["C0", "C0"][:len(levels)] + ["C0"])
        ax.set_xlabel(names[0])
        ax.set_ylabel(names[1])
        if truth:
            ax.plot(truth.get(names[0]), truth.get(names[1]), "k+", ms=10, label="truth")
            ax.legend(fontsize=8)
        ax.set_title("exact posterior, 68% and 95%", fontsize=10)
    axm.plot(*s8_cdf(g), "C0-")
    for q in (0.16, 0.5, 0.84):
        axm.axhline(q, color="grey", lw=0.5, ls=":")
    if truth and "S8" in truth:
        axm.axvline(truth["S8"], color="k", lw=0.8, label="truth")
        axm.legend(fontsize=8)
    axm.set_xlabel("S8")
    axm.set_ylabel("cumulative posterior mass")
    axm.set_title("marginal of S8 (16, 50, 84%)", fontsize=10)
    save_figure(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--n", type=int, default=15, help="grid points per parameter in each pass (default 15)")
    ap.add_argument("--span", type=float, default=3.0, help="the coarse pass: prior sds of each latent (default 3)")
    ap.add_argument("--width", type=float, default=5.0, help="the fine pass: first-pass sds about its mean (default 5)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (after --)")
    args = ap.parse_args(argv)

    import numpy as np

    from fli.cli.compose import compose
    from fli.infer.posterior.exact import grid_posterior
    from fli.infer.posterior.setup import prepare
    from fli.infer.posterior.params import with_derived

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    log = logging.getLogger("exact")
    try:
        cfg, _ = compose(list(args.overrides))
        if cfg.simulation.forward != "linear":
            raise ValueError(f"simulation.forward is {cfg.simulation.forward!r}; the exact posterior needs "
                             "simulation.forward=linear")
        obs, post, data = prepare(cfg, log, compare_truth=False)
    except (ValueError, OSError) as e:  # ConfigError is a ValueError; a missing or damaged mock an OSError
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def progress(i, total):
        if i == 1 or i % max(1, total // 10) == 0 or i == total:
            log.info("  %d/%d grid points", i, total)

    passes, g = [], None
    center, half = None, None
    for label in ("coarse", "fine"):
        t0 = time.perf_counter()
        log.info("%s pass: %d^%d grid points", label, args.n, post.prior.n)
        g = grid_posterior(post, data, n=args.n, span=args.span, center=center, half_width=half, progress=progress)
        zs = np.meshgrid(*g.axes, indexing="ij")
        w = g.weights
        mean_z = np.array([(w * z).sum() for z in zs])
        sd_z = np.array([np.sqrt((w * (z - m) ** 2).sum()) for z, m in zip(zs, mean_z, strict=True)])
        passes.append({"pass": label, "axes_z": [a.tolist() for a in g.axes], "edge_mass": g.edge_mass(),
                       "seconds": time.perf_counter() - t0, "mean_z": mean_z.tolist(), "sd_z": sd_z.tolist()})
        log.info("%s pass: edge mass %.2e, %.0f s", label, g.edge_mass(), passes[-1]["seconds"])
        center, half = mean_z, args.width * np.maximum(sd_z, 1e-3)
    truth = None
    if obs.has_truth and obs.truth:
        truth = {k: float(v) for k, v in with_derived(dict(obs.truth)).items() if k in g.physical}
    moments = g.moments()
    result = {"description": "exact posterior of the cosmological parameters under the linear forward "
                             "(fli/infer/posterior/exact.py), the field integrated out; moments from the fine pass",
              "mock": str(cfg.mock), "moments": moments, "truth": truth, "passes": passes, "names": list(g.names)}
    (out / "exact_posterior.json").write_text(json.dumps(result, indent=2))
    np.savez(out / "exact_posterior.npz", log_p=g.log_p, **{f"axis_{i}": a for i, a in enumerate(g.axes)},
             **{f"physical_{k}": v for k, v in g.physical.items()})
    _figure(g, truth, out / "exact_posterior.png")
    for name, m in moments.items():
        t = "" if not truth or name not in truth else f"  (truth {truth[name]:.4f})"
        log.info("%-8s %.4f +- %.4f%s", name, m["mean"], m["sd"], t)
    if passes[-1]["edge_mass"] > 1e-3:
        log.warning("the fine grid's edges hold %.1e of the mass: widen --width", passes[-1]["edge_mass"])
    log.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
