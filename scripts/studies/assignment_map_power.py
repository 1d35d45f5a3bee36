#!/usr/bin/env python
"""What the mass assignment does to the maps: the noiseless convergence's power with TSC over that
with CIC (simulation.assignment), same truth, seed and config, per source bin and ell bin.

TSC smooths the PM force and the painted density more than CIC at the cell scale (window sinc^3
against sinc^2 per axis), so it costs power wherever the map's signal comes from near the grid
scale. One forward per assignment, as fli-mock runs it (no shape noise).

    python -m scripts.studies.assignment_map_power --experiments tiny default --json docs/bench/assignment_map_power.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from scripts.studies.study import emit  # noqa: E402


def ratio(experiment: str, n_bins_ell: int) -> dict:
    import jax  # noqa: PLC0415

    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.forward import build_forward, fiducial_cosmology  # noqa: PLC0415
    from fli.lensing.limber import map_power_spectrum  # noqa: PLC0415
    from fli.sim.sharding import white_noise  # noqa: PLC0415

    base = [] if experiment == "default" else [f"experiment={experiment}"]
    cl = {}
    for scheme in ("cic", "tsc"):
        cfg, _ = compose([*base, f"simulation.assignment={scheme}"])
        fwd = build_forward(cfg)
        grid = fwd.grid
        noise = white_noise(cfg.seed, grid.shape, grid.mesh, dtype=grid.jdtype)
        kappa, _ = jax.jit(lambda c, s, fwd=fwd: fwd(c, s))(fiducial_cosmology(cfg), noise)
        ell, cl[scheme], _ = map_power_spectrum(np.asarray(kappa), cfg.lensing.fov_deg, n_bins_ell=n_bins_ell,
                                                taper=0.2)
        print(f"{experiment}: {scheme} done", file=sys.stderr, flush=True)
    return {"experiment": experiment, "ell": np.asarray(ell).tolist(),
            "tsc_over_cic": (np.asarray(cl["tsc"]) / np.asarray(cl["cic"])).tolist()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiments", nargs="+", default=["tiny"], help="tiny, default, or any experiment name")
    ap.add_argument("--ell-bins", type=int, default=8)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    emit({"runs": [ratio(e, a.ell_bins) for e in a.experiments]}, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
