"""Figures of ``fli-diagnose`` (matplotlib, Agg; one process).

ArviZ draws the trace, rank, pair (divergences, a mock's truth) and energy plots. The others:
the S8 posterior against its prior (sampled through :class:`fli.infer.priors.PriorTransform`),
the white noise's P(k) of the draws against the prior expectation (white noise of unit
variance per cell: P = the cell volume), and with ``running.zarr`` and a mock's truth the
posterior mean and standard deviation of the field (a slice), r(k) of the posterior mean with
the truth, the posterior mass maps, and posterior-predictive residual maps of the thinned draws
in ``fields.zarr``. A figure that cannot be drawn is skipped with a note saying why.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from fli.infer.inference_data import quiet_arviz
from fli.infer.params import reported_names, with_derived
from fli.infer.run_store import pooled_running, read_thinned_kappa
from fli.plots import pyplot, save_figure


def figures(idata, chains, report: dict, run_dir: Path, dcfg, log: logging.Logger) -> tuple[dict, list[str]]:
    """Draw every figure into ``run_dir``; returns ({name: path}, notes on what was skipped)."""
    import arviz as az  # noqa: PLC0415

    plt = pyplot()
    out, notes = {}, []
    names = reported_names((chains[0].config.get("prior") or {}).get("sample") or [])
    truth = _truth(chains[0], notes)
    ref = _reference(truth, names) if truth is not None else None

    def arviz_fig(name, draw):
        try:
            with quiet_arviz():
                axes = draw()
            fig = np.ravel(axes)[0].get_figure()
            out[name] = str(save_figure(fig, run_dir / f"{name}.png"))
        except Exception as e:  # noqa: BLE001  ArviZ refuses some degenerate chains (e.g. constant)
            notes.append(f"{name}: not drawn ({type(e).__name__}: {e})")
            plt.close("all")

    arviz_fig("trace", lambda: az.plot_trace(idata, var_names=names, compact=False, divergences="bottom",
                                             figsize=(11, 2.2 * len(names)),
                                             backend_kwargs={"constrained_layout": True}))
    arviz_fig("rank", lambda: az.plot_rank(idata, var_names=names, figsize=(11, 2.6 * ((len(names) + 1) // 2)),
                                           backend_kwargs={"constrained_layout": True}))
    pair = [n for n in names if n != "Omega_m"]  # Omega_m = Omega_c + Omega_b: a line against Omega_c
    arviz_fig("pair", lambda: az.plot_pair(idata, var_names=pair, divergences=True, marginals=True,
                                           reference_values=ref, figsize=(2.6 * len(pair),) * 2,
                                           reference_values_kwargs={"color": "C3", "marker": "x",
                                                                    "markersize": 9}))
    arviz_fig("energy", lambda: az.plot_energy(idata, figsize=(6, 4)))
    for name, fn in (("s8_prior", lambda: s8_prior(idata, chains[0].config, ref, run_dir / "s8_prior.png")),
                     ("field_pk", lambda: field_pk(idata, chains[0], truth, run_dir / "field_pk.png"))):
        try:
            out[name] = str(fn())
        except Exception as e:  # noqa: BLE001
            notes.append(f"{name}: not drawn ({type(e).__name__}: {e})")
            plt.close("all")
    try:
        out.update(field_figures(chains, truth, run_dir, dcfg.residual_draws, notes))
    except Exception as e:  # noqa: BLE001
        notes.append(f"field figures: not drawn ({type(e).__name__}: {e})")
        plt.close("all")
    for n_ in notes:
        log.info("figures: %s", n_)
    return out, notes


# ---------------------------------------------------------------- the truth of a mock


def _truth(chain, notes):
    """The mock's observation (with its truth) that the chain's run sampled, or None."""
    from fli.io import load_observation  # noqa: PLC0415

    mock = chain.config.get("mock")
    if not mock:
        notes.append("no mock in the run's config.yaml: no truth, no residual maps")
        return None
    try:
        return load_observation(mock)
    except (OSError, ValueError) as e:
        notes.append(f"mock={mock} not readable ({e}): no truth, no residual maps")
        return None


def _reference(obs, names) -> dict | None:
    if obs.truth is None:
        return None
    t = with_derived(dict(obs.truth))
    return {k: float(t[k]) for k in names if k in t}


# ---------------------------------------------------------------- parameters


def prior_s8(config: dict, n: int = 20000, seed: int = 0) -> np.ndarray:
    """Draws of S8 under the run's prior: sampled parameters through PriorTransform, the
    others at the run's ``cosmology``."""
    import jax  # noqa: PLC0415

    from fli.config import to_config  # noqa: PLC0415
    from fli.infer.priors import PriorTransform  # noqa: PLC0415

    cfg = to_config({k: v for k, v in config.items() if k != "hydra"})
    pt = PriorTransform.from_config(cfg.prior)
    x = np.asarray(pt.sample(jax.random.PRNGKey(seed), (n,)), float)
    p = {k: np.full(n, float(v)) for k, v in vars(cfg.cosmology).items()}
    for i, name in enumerate(pt.names):
        p[name] = x[:, i]
    return with_derived(p)["S8"]


def s8_prior(idata, config: dict, ref, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), constrained_layout=True)
    prior = prior_s8(config)
    post = np.asarray(idata.posterior["S8"]).ravel()
    lo, hi = min(prior.min(), post.min()), max(prior.max(), post.max())
    bins = np.linspace(lo, hi, 60)
    ax.hist(prior, bins=bins, density=True, histtype="stepfilled", color="0.85", label="prior (PriorTransform)")
    ax.hist(post, bins=bins, density=True, histtype="step", lw=1.6, color="C0",
            label=f"posterior: {post.mean():.3f} +- {post.std():.3f}")
    if ref and "S8" in ref:
        ax.axvline(ref["S8"], color="C3", ls="--", label=f"truth {ref['S8']:.3f}")
    ax.set_xlabel(r"$S_8 = \sigma_8 \sqrt{\Omega_m / 0.3}$")
    ax.set_ylabel("density")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


# ---------------------------------------------------------------- the field


def _grid(config: dict):
    """(FFT plan on one device, box [Mpc/h], cell volume [(Mpc/h)^3]) of a run's mesh."""
    from fli.fft import make_fft  # noqa: PLC0415
    from fli.sharding import make_mesh  # noqa: PLC0415

    sim = config["simulation"]
    shape, box = [int(n) for n in sim["mesh"]], [float(b) for b in sim["box"]]
    return make_fft(make_mesh((1, 1)), shape, backend="pencil"), box, float(np.prod(box) / np.prod(shape))


def field_pk(idata, chain, obs, path: Path) -> Path:
    """P(k) of the white noise of the draws over the prior expectation (the cell volume)."""
    import jax.numpy as jnp  # noqa: PLC0415

    from fli.power import default_kedges, power_spectrum  # noqa: PLC0415

    plt = pyplot()
    plan, box, vcell = _grid(chain.config)
    k = np.asarray(chain.k)
    pk = np.asarray(idata.field_summaries["pk_white_noise"]).reshape(-1, k.size) / vcell
    edges = default_kedges(plan, box)
    _, _, nmodes = power_spectrum(jnp.zeros(plan.shape, jnp.float32), plan, box, edges)
    nmodes = np.asarray(nmodes, float)
    same_bins = nmodes.size == k.size  # the run's default bins (fli-nuts's kedges)
    if same_bins:  # shells without a mode (a long box has many) carry no P(k)
        keep = nmodes > 0
        k, pk, nmodes = k[keep], pk[:, keep], nmodes[keep]
    fig, ax = plt.subplots(figsize=(6.4, 3.8), constrained_layout=True)
    q = np.percentile(pk, [2.5, 16, 50, 84, 97.5], axis=0)
    ax.fill_between(k, q[0], q[4], color="C0", alpha=0.2, label="draws: 95%")
    ax.fill_between(k, q[1], q[3], color="C0", alpha=0.35, label="draws: 68%")
    ax.plot(k, q[2], "C0-", lw=1.2, label="draws: median")
    ax.plot(k, np.ones_like(k), "k-", lw=0.8, label="prior expectation (P = cell volume)")
    if same_bins:
        sig = np.sqrt(2.0 / nmodes)
        ax.plot(k, 1 + sig, "k:", lw=0.8, label=r"prior $\pm 1\sigma$ of one draw ($\sqrt{2/N_{modes}}$)")
        ax.plot(k, 1 - sig, "k:", lw=0.8)
    if same_bins and obs is not None and obs.white_noise is not None:
        _, pt, _ = power_spectrum(jnp.asarray(obs.white_noise, jnp.float32), plan, box, edges)
        ax.plot(k, np.asarray(pt)[keep] / vcell, "C3--", lw=1.0, label="truth")
    _logk(ax)
    ax.set_xlabel("k [h/Mpc]")
    ax.set_ylabel("P(k) / cell volume")
    ax.set_title("white noise of the posterior draws", fontsize=10)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def field_figures(chains, obs, run_dir: Path, n_resid: int, notes) -> dict:
    out = {}
    pooled = pooled_running([c.run for c in chains], notes)
    has_truth = obs is not None and obs.has_truth
    fov = obs.fov_deg if obs is not None else float(chains[0].config.get("lensing", {}).get("fov_deg", 1.0))
    if pooled is not None:
        notes.append(f"field mean and standard deviation from running.zarr: {pooled['n']} post-warm-up draws "
                     "of the chains (each chain's draws to its last checkpoint, not truncated)")
        truth_s = np.asarray(obs.white_noise) if has_truth else None
        out["field_slices"] = str(field_slices(pooled, truth_s, chains[0].config, run_dir / "field_slices.png"))
        out["mass_maps"] = str(mass_maps(pooled, np.asarray(obs.kappa_true) if has_truth else None, fov,
                                         run_dir / "mass_maps.png"))
        if has_truth:
            out["r_k"] = str(r_of_k(pooled["mean_white_noise"], truth_s, chains[0].config, run_dir / "r_k.png"))
    if obs is not None and n_resid > 0:
        p = residuals(chains, obs, n_resid, run_dir / "residuals.png")
        if p is None:
            notes.append("residuals: no thinned post-warm-up field draw in fields.zarr")
        else:
            out["residuals"] = str(p)
    return out


def _logk(ax):
    from matplotlib.ticker import NullFormatter  # noqa: PLC0415

    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap over one decade


def _img(ax, m, title, vmin=None, vmax=None, cmap="RdBu_r", extent=None, aspect="equal"):
    im = ax.imshow(m, origin="lower", vmin=vmin, vmax=vmax, cmap=cmap, extent=extent, aspect=aspect)
    ax.set_title(title, fontsize=9)
    return im


def field_slices(pooled, truth, config, path: Path) -> Path:
    """Slice y = ny/2 of the posterior mean and sd of the white noise, beside the truth."""
    plt = pyplot()
    mean, sd = pooled["mean_white_noise"], np.sqrt(pooled["var_white_noise"])
    j = mean.shape[1] // 2
    box = config["simulation"]["box"]
    ext = (0, box[2], 0, box[0])
    rows = [("posterior mean", mean[:, j, :], -3, 3, "RdBu_r"), ("posterior sd", sd[:, j, :], 0, 1.2, "viridis")]
    if truth is not None:
        rows.insert(0, ("truth", truth[:, j, :], -3, 3, "RdBu_r"))
        rows.append(("(truth - mean) / sd", (truth - mean)[:, j, :] / np.maximum(sd[:, j, :], 1e-12), -3, 3,
                     "RdBu_r"))
    fig, axes = plt.subplots(len(rows), 1, figsize=(10, 1.7 * len(rows) + 0.6), sharex=True, squeeze=False,
                             constrained_layout=True)
    for ax, (t, m, lo, hi, cm) in zip(axes[:, 0], rows, strict=True):
        im = _img(ax, m, f"white noise, {t}, slice y = Ly/2", lo, hi, cm, ext, "auto")
        ax.set_ylabel("x [Mpc/h]")
        fig.colorbar(im, ax=ax, shrink=0.9)
    axes[-1, 0].set_xlabel("z (line of sight) [Mpc/h]")
    return save_figure(fig, path)


def mass_maps(pooled, k_true, fov, path: Path) -> Path:
    """Posterior mean and sd of the noiseless kappa per bin, beside the truth."""
    plt = pyplot()
    mean, sd = pooled["mean_kappa"], np.sqrt(pooled["var_kappa"])
    nb = mean.shape[0]
    rows = [("posterior mean", mean), ("posterior sd", sd)]
    if k_true is not None:
        rows.insert(0, ("truth (noiseless)", k_true))
    ext = (-fov / 2, fov / 2, -fov / 2, fov / 2)
    fig, axes = plt.subplots(len(rows), nb, figsize=(3.4 * nb + 0.8, 3.0 * len(rows)), squeeze=False,
                             constrained_layout=True)
    for b in range(nb):
        lim = float(np.max(np.abs(k_true[b] if k_true is not None else mean[b]))) or 1.0
        for r, (t, m) in enumerate(rows):
            sdrow = t == "posterior sd"
            im = _img(axes[r, b], m[b].T, f"bin {b}: kappa, {t}", 0 if sdrow else -lim,
                      float(sd[b].max()) if sdrow else lim, "viridis" if sdrow else "RdBu_r", ext)
            axes[r, b].set_xlabel("deg")
            fig.colorbar(im, ax=axes[r, b], shrink=0.8)
    return save_figure(fig, path)


def r_of_k(mean, truth, config, path: Path) -> Path:
    """Cross-correlation r(k) of the posterior-mean white noise with the true one."""
    import jax.numpy as jnp  # noqa: PLC0415

    from fli.power import cross_correlation, power_spectrum  # noqa: PLC0415

    plt = pyplot()
    plan, box, _ = _grid(config)
    a, b = jnp.asarray(mean, jnp.float32), jnp.asarray(truth, jnp.float32)
    k, r = cross_correlation(a, b, plan, box)
    _, pa, n = power_spectrum(a, plan, box)
    _, pb, _ = power_spectrum(b, plan, box)
    keep = np.asarray(n) > 0  # shells without a mode carry nothing
    k, r, pa, pb = (np.asarray(x)[keep] for x in (k, r, pa, pb))
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    ax[0].plot(np.asarray(k), np.asarray(r), "C0o-", ms=3)
    ax[0].axhline(0, color="0.8", lw=0.6)
    ax[0].set_ylabel("r(k): posterior mean x truth")
    ax[0].set_ylim(-1.05, 1.05)  # the largest scales hold a few modes: r scatters over [-1, 1]
    ax[1].plot(np.asarray(k), np.sqrt(np.asarray(pa) / np.asarray(pb)), "C1o-", ms=3)
    ax[1].axhline(1, color="0.8", lw=0.6)
    ax[1].set_ylabel("T(k) = sqrt(P_mean / P_truth)")
    for x in ax:
        _logk(x)
        x.set_xlabel("k [h/Mpc]")
    ax[0].set_title("white noise: the posterior mean against the truth", fontsize=10)
    return save_figure(fig, path)


def residuals(chains, obs, n: int, path: Path) -> Path | None:
    """(observed - predicted) / sigma per bin for a few thinned draws, with chi^2 per pixel."""
    draws = read_thinned_kappa([c.run for c in chains], [c.chunks for c in chains], n)
    if not draws:
        return None
    plt = pyplot()
    kobs = np.asarray(obs.kappa_obs, np.float64)
    sigma = np.asarray(obs.noise_sigma, np.float64)
    mask = np.ones(kobs.shape[1:], bool) if obs.mask is None else np.asarray(obs.mask, bool)
    nb, fov = kobs.shape[0], obs.fov_deg
    ext = (-fov / 2, fov / 2, -fov / 2, fov / 2)
    fig, axes = plt.subplots(len(draws), nb, figsize=(3.4 * nb + 1, 3.0 * len(draws)), squeeze=False,
                             constrained_layout=True)
    for r, (run, d, kap) in enumerate(draws):
        for b in range(nb):
            res = np.where(mask, (kobs[b] - kap[b]) / sigma[b], 0.0)
            chi2 = float(np.sum(res[mask] ** 2) / mask.sum())
            im = _img(axes[r, b], res.T, f"{Path(run).name} draw {d}, bin {b}\nchi2 per pixel {chi2:.2f}", -3, 3,
                      "RdBu_r", ext)
            axes[r, b].set_xlabel("deg")
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6, label="(observed - draw) / noise")
    return save_figure(fig, path)
