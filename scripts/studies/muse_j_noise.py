#!/usr/bin/env python
"""How much do N simulations bias MUSE's reported width? A Monte Carlo over the noise of J and H.

MUSE's latent covariance is ``(H^T J^-1 H + I)^-1`` (fli.infer.muse.result.covariance), with
``J`` the scores' sample covariance over ``N`` simulations and ``H`` their mean finite
difference. Taking a finished run's own ``H``, ``H_se`` and ``J`` (map.json's ``muse`` block) as
the truth, this draws ``J_hat`` as the sample covariance of ``N`` Gaussian scores of covariance
``J`` and ``H_hat = H + H_se * noise``, and reports, per parameter, the mean over draws of the
latent sd computed from them divided by the sd from ``H`` and ``J``: below 1, MUSE's width
reads narrow on average because of its simulations' number alone.

    python -m scripts.studies.muse_j_noise docs/bench/muse_tsc_pair0_map.json --n-sims 16 32 64
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from fli.infer.muse.result import covariance  # noqa: E402


def width_bias(h, h_se, j, n_sims: int, draws: int, seed: int = 0, with_h: bool = True) -> np.ndarray:
    """Mean over ``draws`` of sd(H_hat, J_hat) / sd(H, J), per parameter. The draws are batched:
    ``(H^T J^-1 H + I)^-1`` on stacks of matrices, the formula of
    :func:`fli.infer.muse.result.covariance` (which gives the reference sd)."""
    rng = np.random.default_rng(seed)
    h, h_se, j = (np.atleast_2d(np.asarray(a, np.float64)) for a in (h, h_se, j))
    p = h.shape[0]
    sd0 = np.sqrt(np.diag(covariance(h, j)))
    scores = rng.standard_normal((draws, n_sims, p)) @ np.linalg.cholesky(j).T
    centred = scores - scores.mean(axis=1, keepdims=True)
    j_hat = np.einsum("dni,dnk->dik", centred, centred) / (n_sims - 1)
    h_hat = h + h_se * rng.standard_normal((draws, p, p)) if with_h else np.broadcast_to(h, (draws, p, p))
    prec = np.swapaxes(h_hat, 1, 2) @ np.linalg.solve(j_hat, h_hat) + np.eye(p)
    cov = np.linalg.inv(0.5 * (prec + np.swapaxes(prec, 1, 2)))
    return np.mean(np.sqrt(np.diagonal(cov, axis1=1, axis2=2)) / sd0, axis=0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("map_json", type=Path, help="map.json of a finished MUSE run")
    ap.add_argument("--n-sims", type=int, nargs="+", default=[16, 32], help="simulation counts to try")
    ap.add_argument("--draws", type=int, default=20000)
    a = ap.parse_args(argv)
    try:
        m = json.loads(a.map_json.read_text())["muse"]
        h, h_se, j, names = m["H"], m["H_se"], m["J"], m["cov_names"]
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"{a.map_json}: not a MUSE run's map.json with H, H_se and J ({e!r})") from None
    names = names[: len(h)]  # the sampled parameters come first, the derived ones (Omega_m, S8) after
    print(f"{a.map_json}: H = {h}, H_se = {h_se}, J = {j}")
    for n in a.n_sims:
        if n <= len(h) + 1:
            raise SystemExit(f"--n-sims {n}: needs more than {len(h) + 1} simulations for a J of full rank")
        both = width_bias(h, h_se, j, n, a.draws)
        j_only = width_bias(h, h_se, j, n, a.draws, with_h=False)
        print(f"N = {n:3d}: mean sd ratio, J's noise only: "
              + ", ".join(f"{k} {v:.3f}" for k, v in zip(names, j_only, strict=True))
              + "; J's and H's: " + ", ".join(f"{k} {v:.3f}" for k, v in zip(names, both, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
