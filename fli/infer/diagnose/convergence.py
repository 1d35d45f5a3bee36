"""fli-diagnose's convergence numbers, all ArviZ's: of the parameters, of the white noise's
P(k) bins, and of the field's data-constrained projections where a run recorded them
(:mod:`fli.infer.sample.projections`)."""

from __future__ import annotations

import json
import math

import numpy as np

from fli.infer.sample.inference_data import PROJECTIONS, quiet_arviz


def finite(x) -> float | None:
    """``x`` as a float, or None where it is not finite (JSON has no NaN)."""
    x = float(x)
    return x if math.isfinite(x) else None


def harmonic_mean(x) -> float | None:
    x = np.asarray(x, float)
    if x.size == 0 or not np.all(np.isfinite(x)) or np.any(x <= 0):
        return None
    return float(x.size / np.sum(1.0 / x))


def convergence(idata, names: list[str]) -> dict:
    """Per parameter: mean, sd, R-hat, bulk/tail ESS, MCSE of the mean and sd (ArviZ)."""
    import arviz as az  # noqa: PLC0415

    with quiet_arviz():
        rhat = az.rhat(idata, var_names=names, method="rank")
        bulk = az.ess(idata, var_names=names, method="bulk")
        tail = az.ess(idata, var_names=names, method="tail")
        mc_mean = az.mcse(idata, var_names=names, method="mean")
        mc_sd = az.mcse(idata, var_names=names, method="sd")
    post = idata.posterior
    out = {k: {"mean": finite(post[k].mean()), "sd": finite(post[k].std()), "rhat": finite(rhat[k]),
               "ess_bulk": finite(bulk[k]), "ess_tail": finite(tail[k]), "mcse_mean": finite(mc_mean[k]),
               "mcse_sd": finite(mc_sd[k]), "stuck": []} for k in names}
    for k in names:
        for c in range(post.sizes["chain"]):
            x = np.asarray(post[k].isel(chain=c).values, np.float64)
            if constant(x):
                out[k]["stuck"].append({"chain": c, "value": float(x[0]), "draws": int(x.size)})
        if out[k]["stuck"]:  # ArviZ reports a constant chain's ESS as its length, and R-hat can pass: neither holds
            out[k].update(rhat=None, ess_bulk=None, ess_tail=None)
    return out


def constant(x) -> bool:
    """Whether draws ``x`` never move: a range under 1e-6 of their size (float32 rounding of a
    derived parameter at a fixed point stays below it; a moving chain's steps are far above)."""
    x = np.asarray(x, np.float64)
    return bool(x.size > 1 and np.ptp(x) <= 1e-6 * np.max(np.abs(x)))


def field_convergence(idata) -> dict:
    """ArviZ's R-hat and bulk/tail ESS of each P(k) bin of the white-noise draws, with their
    minimum (maximum for R-hat) and harmonic mean over the bins."""
    import arviz as az  # noqa: PLC0415

    ds = idata.field_summaries[["pk_white_noise"]]
    with quiet_arviz():
        rhat = np.asarray(az.rhat(ds, method="rank")["pk_white_noise"], float)
        bulk = np.asarray(az.ess(ds, method="bulk")["pk_white_noise"], float)
        tail = np.asarray(az.ess(ds, method="tail")["pk_white_noise"], float)
    nan = lambda a: [finite(v) for v in a]  # noqa: E731
    return {"summary": "P(k) of the white noise of every draw, one bin per variable",
            "k": json.loads(idata.field_summaries.attrs["k"]), "rhat": nan(rhat), "ess_bulk": nan(bulk),
            "ess_tail": nan(tail),
            "rhat_max": finite(np.max(rhat)) if np.all(np.isfinite(rhat)) else None,
            "ess_bulk_min": finite(np.min(bulk)) if np.all(np.isfinite(bulk)) else None,
            "ess_tail_min": finite(np.min(tail)) if np.all(np.isfinite(tail)) else None,
            "ess_bulk_harmonic_mean": harmonic_mean(bulk), "ess_tail_harmonic_mean": harmonic_mean(tail)}


def projection_convergence(idata) -> dict | None:
    """R-hat and bulk/tail ESS of each data-constrained projection of the field (largest
    eigenvalue first), with the largest R-hat and the smallest ESS; None where the chains
    recorded none."""
    import arviz as az  # noqa: PLC0415

    if "field_summaries" not in idata.groups() or PROJECTIONS not in idata.field_summaries:
        return None
    ds = idata.field_summaries[[PROJECTIONS]]
    with quiet_arviz():
        rhat = np.asarray(az.rhat(ds, method="rank")[PROJECTIONS], float)
        bulk = np.asarray(az.ess(ds, method="bulk")[PROJECTIONS], float)
        tail = np.asarray(az.ess(ds, method="tail")[PROJECTIONS], float)
    ok = lambda a: bool(a.size) and bool(np.all(np.isfinite(a)))  # noqa: E731
    return {"summary": "v_k . (z - ref) of every draw, v_k the top eigenvectors of the Gauss-Newton J^T J",
            "count": int(rhat.size), "rhat": [finite(v) for v in rhat], "ess_bulk": [finite(v) for v in bulk],
            "ess_tail": [finite(v) for v in tail],
            "rhat_max": finite(np.max(rhat)) if ok(rhat) else None,
            "rhat_argmax": int(np.argmax(rhat)) if ok(rhat) else None,
            "ess_bulk_min": finite(np.min(bulk)) if ok(bulk) else None,
            "ess_tail_min": finite(np.min(tail)) if ok(tail) else None}
