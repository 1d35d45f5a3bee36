"""fli-diagnose's sampler statistics, per chain and in all: divergences, E-BFMI (ArviZ's),
NUTS's tree depth against its cap, and unadjusted MCLMC's energy error against the target its
warm-up aimed at. Each kernel is read by its own statistics (docs/diagnose.md)."""

from __future__ import annotations

import numpy as np

from fli.infer.config_keys import ADDED
from fli.infer.diagnose.convergence import finite as _f
from fli.infer.sample.inference_data import quiet_arviz


def energy_error_target(inference: dict) -> float:
    """The energy error's variance per dimension that an MCLMC run's warm-up tuned its step to:
    its ``inference.mclmc_energy_error``, or the old default where it was made before the key."""
    return float(inference.get("mclmc_energy_error", ADDED["inference.mclmc_energy_error"]))


def _max_depth_ends(depth, diverging, turning, maxd) -> dict:
    """Fractions of a chain's draws whose tree reached ``maxd``, by what ended it:

    * ``cap``: the depth cap (no U-turn, no divergence), and draws of a run made before
      ``turning`` was recorded, which cannot be told apart from it (a full tree at the last
      depth has the same length either way);
    * ``uturn``: a U-turn at the last doubling (the trajectory was long enough);
    * ``unrecorded``: of ``cap``, the draws with no record.
    """
    at_max = np.asarray(depth) >= maxd
    turn = np.full(at_max.shape, np.nan) if turning is None else np.asarray(turning, float)
    known = np.isfinite(turn)
    uturn = at_max & known & (turn > 0.5)
    cap = at_max & ~uturn & ~np.asarray(diverging, bool)
    return {"cap": float(np.mean(cap)), "uturn": float(np.mean(uturn)), "unrecorded": float(np.mean(cap & ~known))}


def sampler_health(idata, chains: list) -> dict:
    """Divergences after warm-up, E-BFMI (ArviZ), tree-depth saturation, step size, acceptance
    and MCLMC's energy error, per chain and in all; ``chains``: fli-diagnose's
    :class:`fli.infer.diagnose.chains.Chain` (its ``config`` and ``run`` are read)."""
    import arviz as az  # noqa: PLC0415

    st = idata.sample_stats
    with quiet_arviz():
        bfmi = np.asarray(az.bfmi(idata), float)  # NaN for MCLMC, which has no Hamiltonian to read
    div = np.asarray(st["diverging"], bool)
    depth = np.asarray(st["tree_depth"])
    per = []
    for j, c in enumerate(chains):
        inf = c.config.get("inference", {}) or {}
        kernel = inf.get("kernel", "nuts")
        maxd = inf.get("max_tree_depth")
        ends = _max_depth_ends(depth[j], div[j], st["turning"][j] if "turning" in st else None, maxd) \
            if kernel == "nuts" and maxd is not None else {}
        per.append({"run": str(c.run), "divergences": int(div[j].sum()), "ebfmi": _f(bfmi[j]),
                    "tree_depth_saturation": ends.get("cap"), "max_depth_uturn": ends.get("uturn"),
                    "max_depth_unrecorded": ends.get("unrecorded"),
                    "max_tree_depth": maxd if kernel == "nuts" else None,
                    "kernel": kernel, "mean_tree_depth": _f(depth[j].mean()),
                    "step_size": _f(np.mean(st["step_size"][j])),
                    "acceptance": _f(np.mean(st["acceptance_rate"][j])),
                    **_energy_error(st, j, inf, kernel == "mclmc" and "energy_error" in st)})
    sats = [p["tree_depth_saturation"] for p in per if p["tree_depth_saturation"] is not None]
    errs = [p["energy_error_ratio"] for p in per if p["energy_error_ratio"] is not None]
    return {"per_chain": per, "divergences": int(div.sum()), "draws": int(div.size),
            "divergence_fraction": float(div.mean()),
            "ebfmi_min": _f(np.min(bfmi)) if np.all(np.isfinite(bfmi)) else None,
            "tree_depth_saturation_max": max(sats) if sats else None,
            "energy_error_ratio_max": max(errs) if errs else None}


def _energy_error(st, j: int, inference: dict, unadjusted: bool) -> dict:
    """Unadjusted MCLMC's chain ``j``: its energy error's variance per dimension, the target its
    warm-up tuned it to (``inference.mclmc_energy_error``; a run made before the key had the old
    default) and their ratio, which diagnose's bands judge; None for other kernels."""
    if not unadjusted:
        return dict.fromkeys(("energy_error_var_per_dim", "energy_error_target", "energy_error_ratio"))
    var = _f(np.nanmean(np.asarray(st["energy_error"][j]) ** 2))
    target = energy_error_target(inference)
    return {"energy_error_var_per_dim": var, "energy_error_target": target,
            "energy_error_ratio": None if var is None else var / target}
