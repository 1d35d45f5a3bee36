#!/usr/bin/env python
"""Evolved matter P(k) of the PM (2LPT + FastPM) against halofit (pyccl), as a figure and JSON.

    python -m scripts.studies.pk_halofit --mesh 128 --box 256 --steps 10 --pdims 1x2 --out docs/figures/pk_halofit.png

Runs the PM with the default force resolution correction and without it (same white noise),
measures P(k) of the CIC-painted particles with the CIC window divided out, and reports the
k where each first falls 10% below halofit (the PM's effective resolution). Refuses a run whose
particles outran the halo. Needs pyccl (a test dependency).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mesh", type=int, default=128)
    ap.add_argument("--box", type=float, default=256.0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--pdims", default="1x2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--halo", type=int, default=24, help="cells; must exceed the largest displacement")
    ap.add_argument("--out", default="pk_halofit.png")
    args = ap.parse_args(argv)
    px, py = (int(v) for v in args.pdims.split("x"))
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={px * py}"

    import jax  # noqa: PLC0415
    import matplotlib.pyplot as plt  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import pyccl  # noqa: PLC0415

    from fli import plots  # noqa: PLC0415,F401  (sets the Agg backend)
    from fli.cosmo.background import planck18  # noqa: PLC0415
    from fli.sim.fft import cic_compensation  # noqa: PLC0415
    from fli.sim.grid import Grid  # noqa: PLC0415
    from fli.cosmo.linear_power import linear_power  # noqa: PLC0415
    from fli.sim.nbody import density, simulate  # noqa: PLC0415
    from fli.sim.power import power_spectrum  # noqa: PLC0415
    from fli.sim.sharding import make_mesh, white_noise  # noqa: PLC0415

    c = planck18()
    spectra, max_disp = {}, {}
    for corr in (0.25, 0.0):
        grid = Grid((args.mesh,) * 3, (args.box,) * 3, make_mesh((px, py)), halo=args.halo, force_correction=corr)
        s = white_noise(args.seed, grid.shape, grid.mesh)
        st, _, maxd = jax.jit(lambda c, s: simulate(c, s, grid, np.linspace(0.1, 1.0, args.steps + 1)))(c, s)
        max_disp[corr] = float(np.max(np.asarray(maxd)))
        if max_disp[corr] >= args.halo:
            print(f"particles moved {max_disp[corr]:.1f} cells, more than --halo {args.halo}: raise it",
                  file=sys.stderr)
            return 1
        plan = grid.fft
        delta = plan.irfft(plan.rfft(density(st.disp, grid) - 1.0) * cic_compensation(plan))
        k, spectra[corr], _ = (np.asarray(v) for v in power_spectrum(delta, plan, grid.box))
    cc = pyccl.Cosmology(Omega_c=c.Omega_c, Omega_b=c.Omega_b, h=c.h, n_s=c.n_s, sigma8=c.sigma8,
                         transfer_function="eisenstein_hu", matter_power_spectrum="halofit",
                         Omega_g=0, Neff=0, m_nu=0)
    h = c.h
    p_hf = pyccl.nonlin_matter_power(cc, k * h, 1.0) * h**3
    p_lin = np.asarray(linear_power(c, k, 1.0))
    ratios = {corr: spectra[corr] / p_hf for corr in spectra}
    k_nyq = np.pi * args.mesh / args.box

    def first_short(ratio):
        """Smallest k beyond which the ratio (running mean over 5 bins, against the cosmic
        variance of one box) stays below 0.9 up to 0.7 k_Nyquist."""
        sm = np.convolve(ratio, np.ones(5) / 5, mode="same")
        sel = k < 0.7 * k_nyq
        below = (sm < 0.9) & sel
        for i in np.nonzero(below)[0]:
            if np.all(below[i:][sel[i:]]):
                return float(k[i])
        return None

    res = {"mesh": args.mesh, "box": args.box, "steps": args.steps, "k_nyquist": k_nyq, "halo": args.halo,
           "k_10pct_short": first_short(ratios[0.25]), "k_10pct_short_no_force_correction": first_short(ratios[0.0]),
           "max_disp_cells": max_disp[0.25]}
    fig, (ax, axr) = plt.subplots(2, 1, figsize=(6, 6), sharex=True, height_ratios=[3, 1.4], constrained_layout=True)
    styles = {0.25: ("C0", "PM (force_correction 0.25, default)"), 0.0: ("C1", "PM (force_correction 0)")}
    for corr, (col, label) in styles.items():
        ax.loglog(k, spectra[corr], "-", color=col, lw=1.0, label=label)
        axr.semilogx(k, ratios[corr], "-", color=col, lw=1.0)
    ax.loglog(k, p_hf, "k-", lw=0.8, label="halofit (pyccl)")
    ax.loglog(k, p_lin, "k:", label="linear")
    ax.set_ylabel(r"$P(k)$ [$(h^{-1}$Mpc$)^3$]")
    ax.set_title(f"{args.mesh}$^3$ particles, {args.box:g} Mpc/h, 2LPT + {args.steps} FastPM steps, z = 0\n"
                 "CIC window divided out", fontsize=10)
    ax.legend(fontsize=8)
    axr.axhline(1, color="k", lw=0.6)
    axr.axhline(0.9, color="grey", lw=0.6, ls="--")
    for kk, col in ((res["k_10pct_short"], "C0"), (res["k_10pct_short_no_force_correction"], "C1")):
        if kk:
            axr.axvline(kk, color=col, ls=":", lw=0.8)
    axr.set_ylim(0.3, 1.3)
    axr.set_ylabel("PM / halofit")
    axr.set_xlabel(r"$k$ [$h$/Mpc]  (Nyquist %.2f)" % k_nyq)
    fig.savefig(args.out, dpi=110)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
