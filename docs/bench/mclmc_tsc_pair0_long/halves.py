"""Each parameter's mean (Omega_c, sigma8, S8) over each half of the post-warm-up draws, with
ArviZ's MCSE: a transient left after the warm-up, or a drift, would show as halves that disagree.
Usage: halves.py <fli-diagnose run>/chains.nc"""
import sys

import arviz as az
import numpy as np

d = az.from_netcdf(sys.argv[1]).posterior
n = d.sizes["draw"]
for p in ("Omega_c", "sigma8", "S8"):
    out = []
    for lo, hi in ((0, n // 2), (n // 2, n)):
        x = d[p].isel(draw=slice(lo, hi))
        out.append((float(x.mean()), float(az.mcse(x.to_dataset(), method="mean")[p]), float(x.std())))
    (m1, e1, s1), (m2, e2, s2) = out
    print(f"{p}: first half {m1:.4f} +- {e1:.4f} (sd {s1:.3f}), second {m2:.4f} +- {e2:.4f} (sd {s2:.3f}), "
          f"difference {(m2 - m1) / np.hypot(e1, e2):+.2f} combined MCSEs; draws per chain {n}")
