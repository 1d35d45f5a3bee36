"""The parameters' estimates side by side, for fli-diagnose's report: the prior, the truth (a
mock's), the joint MAP and MUSE of the fli-map run the chains started from, and the chains'
posterior, as a table (:func:`estimates`) and a corner plot (:func:`corner`).

The corner plot shows the sampled parameters and S8: prior draws in grey behind the posterior's
draws (divergent ones in orange), the truth as red lines, the MAP as an orange square and MUSE's Gaussian (drawn in its
standardised latents and pushed through the prior transform, as MUSE states it) as its 68 and
95 % contours and marginal densities.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fli.plots import pyplot, save_figure

CENTRAL = (0.5, 99.5)  # the 99 % central interval whose holding of the truth the table reports


def _draws(idata, name: str) -> np.ndarray:
    return np.asarray(idata.posterior[name]).ravel()


def estimates(idata, names: list[str], data: dict) -> list[dict]:
    """One row a parameter: the prior's central 95 %, the truth, the MAP (with its Laplace
    marginal sd), MUSE's mean and sd, the posterior's mean, sd and 99 % interval, and whether
    that interval holds the truth (None without one)."""
    ref, start, prior = data.get("ref") or {}, data.get("start") or {}, data.get("prior")
    muse = (start.get("muse") or {}) if start else {}
    rows = []
    for k in names:
        x = _draws(idata, k)
        lo, hi = np.percentile(x, CENTRAL)
        t = ref.get(k)
        rows.append({
            "param": k,
            "prior95": None if prior is None or k not in prior else [float(q) for q in np.percentile(prior[k], [2.5, 97.5])],
            "truth": t,
            "map": (start.get("map") or {}).get(k) if start else None,
            "map_laplace_sd": (start.get("laplace_sd") or {}).get(k) if start else None,
            "muse": (muse.get("params") or {}).get(k), "muse_sd": (muse.get("sd") or {}).get(k),
            "mean": float(x.mean()), "sd": float(x.std(ddof=1)), "interval99": [float(lo), float(hi)],
            "truth_in_interval99": None if t is None else bool(lo <= t <= hi),
            "sd_over_prior_sd": None if prior is None or k not in prior or np.std(prior[k]) == 0
            else float(x.std(ddof=1) / np.std(prior[k])),
        })
    return rows


def _ellipse(ax, x, y, colour):
    """68 and 95 % contours of the 2D Gaussian with the moments of the draws (x, y)."""
    c = np.cov(x, y)
    if not np.all(np.isfinite(c)):
        return
    w, v = np.linalg.eigh(c)
    t = np.linspace(0, 2 * np.pi, 200)
    circle = np.stack([np.cos(t), np.sin(t)])
    for r2, ls in ((2.30, "-"), (6.18, "--")):  # chi^2 with 2 degrees of freedom at 68 %, 95 %
        e = v @ (np.sqrt(np.maximum(w, 0) * r2)[:, None] * circle)
        ax.plot(x.mean() + e[0], y.mean() + e[1], color=colour, ls=ls, lw=1.1)


def corner(idata, names: list[str], data: dict, path: Path, max_points: int = 4000) -> Path:
    """The corner plot of ``names`` (module docstring)."""
    plt = pyplot()
    ref, start, prior = data.get("ref") or {}, data.get("start") or {}, data.get("prior")
    muse = data.get("muse_draws")
    post = {k: _draws(idata, k) for k in names}
    stats = idata.sample_stats
    div = np.asarray(stats["diverging"]).ravel().astype(bool) if "diverging" in stats else np.zeros(0, bool)
    div = div if div.size == post[names[0]].size else np.zeros(post[names[0]].size, bool)
    rng = np.random.default_rng(0)
    n = len(names)
    fig, axes = plt.subplots(n, n, figsize=(2.7 * n + 0.6, 2.7 * n), squeeze=False, constrained_layout=True)

    def span(k):
        xs = [post[k]] + ([prior[k]] if prior is not None and k in prior else [])
        lo, hi = min(np.percentile(x, 0.2) for x in xs), max(np.percentile(x, 99.8) for x in xs)
        pad = 0.03 * (hi - lo or 1.0)
        return lo - pad, hi + pad

    lims = {k: span(k) for k in names}
    thin = lambda x: x[rng.permutation(x.size)[:max_points]] if x.size > max_points else x  # noqa: E731
    for i, ky in enumerate(names):
        for j, kx in enumerate(names):
            ax = axes[i, j]
            if j > i:
                ax.axis("off")
                continue
            if i == j:
                bins = np.linspace(*lims[kx], 41)
                if prior is not None and kx in prior:
                    ax.hist(prior[kx], bins=bins, density=True, color="0.85", label="prior")
                ax.hist(post[kx], bins=bins, density=True, histtype="step", color="C0", lw=1.5, label="posterior")
                if muse is not None and kx in muse:
                    ax.hist(muse[kx], bins=bins, density=True, histtype="step", color="C2", lw=1.2,
                            label="MUSE's Gaussian")
                if kx in ref:
                    ax.axvline(ref[kx], color="C3", ls="--", lw=1, label="truth")
                if start and kx in (start.get("map") or {}):
                    ax.axvline(start["map"][kx], color="C1", lw=1, label="MAP")
                ax.set_yticks([])
            else:
                sel = rng.permutation(post[kx].size)[:max_points]
                if prior is not None and kx in prior and ky in prior:
                    ps = rng.permutation(prior[kx].size)[:max_points]
                    ax.plot(prior[kx][ps], prior[ky][ps], ",", color="0.75", rasterized=True)
                ax.plot(post[kx][sel], post[ky][sel], ".", ms=1.5, color="C0", alpha=0.4, rasterized=True)
                if div.any():
                    ax.plot(post[kx][div], post[ky][div], ".", ms=3, color="C1", label="divergent")
                if muse is not None and kx in muse and ky in muse:
                    _ellipse(ax, thin(muse[kx]), thin(muse[ky]), "C2")
                if kx in ref and ky in ref:
                    ax.axvline(ref[kx], color="C3", ls="--", lw=0.8)
                    ax.axhline(ref[ky], color="C3", ls="--", lw=0.8)
                m = (start.get("map") or {}) if start else {}
                if kx in m and ky in m:
                    ax.plot(m[kx], m[ky], "s", color="C1", ms=6, mec="k", mew=0.5)
                ax.set_ylim(*lims[ky])
            ax.set_xlim(*lims[kx])
            if i == n - 1:
                ax.set_xlabel(kx)
            if j == 0 and i > 0:
                ax.set_ylabel(ky)
    handles, labels = axes[-1, -1].get_legend_handles_labels()
    if n > 1:
        axes[0, -1].legend(handles, labels, loc="upper right", fontsize=9, frameon=False)
    else:
        axes[0, 0].legend(fontsize=8)
    return save_figure(fig, path)
