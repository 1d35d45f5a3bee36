#!/usr/bin/env python
"""Large-scale growth of the PM against linear theory, per mass assignment: P / (D^2 P_lin) of the
same realisations at k < 0.03 h/Mpc after 2LPT + 10 PM steps (a = 0.1 -> 1), 64^3 particles in
1000 Mpc/h (the configuration of tests/sim/test_nbody.py's growth test). The painted field's
window is divided out with the scheme's own power (sinc^2 CIC, sinc^3 TSC).

Each ``--runs`` entry is ``assignment:force_correction``; the PM applies
``Grid.force_coefficient`` (for TSC 7/6 of the coefficient given).

    python -m scripts.studies.pm_growth --seeds 4 --runs cic:0.25 tsc:0.25 tsc:0.2142857 --json docs/bench/pm_growth_tsc.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from scripts.studies.study import emit  # noqa: E402

POWER = {"cic": 2, "tsc": 3}


def growth(assignment: str, coeff: float, seeds: int) -> dict:
    import jax  # noqa: PLC0415

    from fli.cosmo.background import planck18  # noqa: PLC0415
    from fli.sim.fft import cic_compensation  # noqa: PLC0415
    from fli.sim.grid import Grid  # noqa: PLC0415
    from fli.sim.lpt import linear_field  # noqa: PLC0415
    from fli.sim.nbody import density, simulate  # noqa: PLC0415
    from fli.sim.power import power_spectrum  # noqa: PLC0415
    from fli.sim.sharding import make_mesh, white_noise  # noqa: PLC0415

    grid = Grid((64, 64, 64), (1000.0,) * 3, make_mesh((1, 1)), halo=4, assignment=assignment,
                force_correction=coeff)
    cosmo, plan = planck18(), grid.fft
    run = jax.jit(lambda c, s: simulate(c, s, grid, np.linspace(0.1, 1, 11)))
    ratios = []
    for seed in range(seeds):
        s = white_noise(seed, grid.shape, grid.mesh)
        st, _, _ = run(cosmo, s)
        delta = plan.irfft(plan.rfft(density(st.disp, grid) - 1.0) * cic_compensation(plan, power=POWER[assignment]))
        k, p, _ = power_spectrum(delta, plan, grid.box)
        _, p_lin, _ = power_spectrum(linear_field(cosmo, s, grid, 1.0), plan, grid.box)
        low = np.asarray(k) < 0.03
        ratios.append(np.asarray(p / p_lin)[low].tolist())
        print(f"{assignment} c={coeff:g} seed {seed}: {np.round(ratios[-1], 4).tolist()}", file=sys.stderr, flush=True)
    return {"assignment": assignment, "force_correction": coeff, "force_coefficient": grid.force_coefficient,
            "k": np.asarray(k)[low].tolist(), "ratios": ratios, "mean": np.mean(ratios, 0).tolist(),
            "largest_deviation": float(np.abs(np.asarray(ratios) - 1).max())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--runs", nargs="+", default=["cic:0.25", "tsc:0.25"], help="assignment:force_correction")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    out = []
    for r in a.runs:
        name, _, c = r.partition(":")
        if name not in POWER or not c:
            ap.error(f"--runs takes assignment:force_correction with assignment in {sorted(POWER)}, got {r!r}")
        out.append(growth(name, float(c), a.seeds))
    emit({"runs": out}, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
