"""Figures of ``fli-diagnose`` (matplotlib, Agg; one process): each draws what
:mod:`fli.infer.diagnose.fields` computed, and nothing else.

ArviZ draws the trace, rank and energy plots, and fli its own trace of every draw with the
warm-up shaded and the corner plot of the parameters (:mod:`fli.infer.diagnose.estimates`: the
prior, the truth, the MAP and MUSE beside the posterior); MCLMC chains,
which have no Hamiltonian energy, get their energy error per transition instead. The others:
the observed maps against the posterior's prediction, the S8 posterior against its prior, the white noise's P(k) of the draws against the prior
expectation, and with ``running.zarr`` and a mock's truth the posterior mean and standard
deviation of the field (a slice), r(k) of the posterior mean with the truth, the posterior mass
maps, and posterior-predictive residual maps of thinned draws. A figure that cannot be drawn is
skipped with a note saying why.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from fli.infer.diagnose.estimates import corner
from fli.infer.diagnose.sampler import energy_error_target
from fli.infer.sample.inference_data import quiet_arviz
from fli.infer.posterior.params import names_of_run
from fli.plots import pyplot, save_figure


def figures(idata, chains, data: dict, run_dir: Path, log: logging.Logger, notes: list[str],
            energy_error_ratio_pass: float | None = None) -> dict:
    """Draw every figure into ``run_dir`` from the InferenceData and ``data``
    (:func:`fli.infer.diagnose.fields.figure_data`); returns ``{name: path}``, adding to
    ``notes`` what was skipped. Diagnose's pass band, ``energy_error_ratio_pass`` times the
    chains' largest target (``inference.mclmc_energy_error``), is drawn on the energy errors of
    unadjusted MCLMC (the adjusted kernel's are held by its acceptance instead)."""
    import arviz as az  # noqa: PLC0415

    plt = pyplot()
    out = {}
    config = chains[0].config
    names = names_of_run(config)
    ref, obs = data["ref"], data["obs"]

    def draw(name, fn):
        try:
            out[name] = str(fn())
        except Exception as e:  # noqa: BLE001  ArviZ refuses some degenerate chains (e.g. constant)
            notes.append(f"{name}: not drawn ({type(e).__name__}: {e})")
            plt.close("all")

    def arviz_fig(name, fn):
        def go():
            with quiet_arviz():
                axes = fn()
            return save_figure(np.ravel(axes)[0].get_figure(), run_dir / f"{name}.png")

        draw(name, go)

    arviz_fig("trace", lambda: az.plot_trace(idata, var_names=names, compact=False, divergences="bottom",
                                             figsize=(11, 2.2 * len(names)),
                                             backend_kwargs={"constrained_layout": True}))
    if any(c.warmup_draws and c.n_warmup for c in chains):
        draw("warmup_trace", lambda: warmup_trace(chains, names, run_dir / "warmup_trace.png"))
    arviz_fig("rank", lambda: az.plot_rank(idata, var_names=names, figsize=(11, 2.6 * ((len(names) + 1) // 2)),
                                           backend_kwargs={"constrained_layout": True}))
    pair = [n for n in names if n != "Omega_m"]  # Omega_m = Omega_c + Omega_b: a line against Omega_c
    draw("corner", lambda: corner(idata, pair, data, run_dir / "corner.png"))
    if "field_summaries" in idata.groups() and "projections" in idata.field_summaries:
        p = np.asarray(idata.field_summaries["projections"])  # [chain, draw, K], largest eigenvalue first
        shown = min(p.shape[-1], 6)
        proj = az.from_dict(posterior={f"projection {k}": p[..., k] for k in range(shown)})
        arviz_fig("projections", lambda: az.plot_trace(proj, compact=False, figsize=(11, 1.9 * shown),
                                                       backend_kwargs={"constrained_layout": True}))
    stats = idata.sample_stats
    if "energy_error" in stats and not np.isfinite(np.asarray(stats["energy"])).any():
        notes.append("energy: not drawn (MCLMC has no Hamiltonian energy; energy_error.png instead)")
        unadjusted = all(c.config.get("inference", {}).get("kernel") == "mclmc" for c in chains)
        target = max(energy_error_target(c.config["inference"]) for c in chains) if unadjusted else None
        band = energy_error_ratio_pass * target if target and energy_error_ratio_pass else None
        draw("energy_error", lambda: energy_error(np.asarray(stats["energy_error"]), band,
                                                  run_dir / "energy_error.png", target))
    else:
        arviz_fig("energy", lambda: az.plot_energy(idata, figsize=(6, 4)))
    if data["prior_s8"] is not None:
        draw("s8_prior", lambda: s8_prior(idata, data["prior_s8"], ref, run_dir / "s8_prior.png"))
    if "field_pk" in data:
        draw("field_pk", lambda: field_pk(data["field_pk"], run_dir / "field_pk.png"))
    pooled, has_truth = data["pooled"], obs is not None and obs.has_truth
    fov = obs.fov_deg if obs is not None else float(config.get("lensing", {}).get("fov_deg", 1.0))
    if pooled is not None and obs is not None:
        draw("maps", lambda: observed_maps(obs, pooled["mean_kappa"], fov, run_dir / "maps.png"))
    if pooled is not None:
        truth_s = np.asarray(obs.white_noise) if has_truth else None
        draw("field_slices", lambda: field_slices(pooled, truth_s, config, run_dir / "field_slices.png"))
        draw("mass_maps", lambda: mass_maps(pooled, np.asarray(obs.kappa_true) if has_truth else None, fov,
                                            run_dir / "mass_maps.png"))
    if data["r_k"] is not None:
        draw("r_k", lambda: r_of_k(data["r_k"], run_dir / "r_k.png"))
    if data["residuals"]:
        draw("residuals", lambda: residuals(data["residuals"], fov, run_dir / "residuals.png"))
    for n_ in notes:
        log.info("figures: %s", n_)
    return out


def warmup_trace(chains, names, path: Path) -> Path:
    """Every draw of each chain, warm-up included (shaded), one panel a parameter: a chain that
    ran to a prior's edge during its warm-up and stayed there shows here, not in ``trace.png``
    (post-warm-up draws only)."""
    plt = pyplot()
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 1.9 * len(names)), sharex=True, squeeze=False,
                             constrained_layout=True)
    for ax, name in zip(axes[:, 0], names, strict=True):
        for j, c in enumerate(chains):
            x = np.concatenate([np.asarray(c.warmup_draws.get(name, [])), np.asarray(c.draws[name])])
            ax.plot(np.arange(x.size), x, lw=0.7, color=f"C{j % 10}", label=f"chain {j}")
        ax.axvspan(0, max(c.n_warmup for c in chains), color="0.9", zorder=0)
        ax.set_ylabel(name)
    axes[0, 0].set_title("every draw; shaded: warm-up", fontsize=10)
    axes[0, 0].legend(fontsize=7, ncols=min(len(chains), 8), loc="upper right")
    axes[-1, 0].set_xlabel("draw")
    return save_figure(fig, path)


def s8_prior(idata, prior: np.ndarray, ref, path: Path) -> Path:
    """The posterior of S8 over draws of its prior."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), constrained_layout=True)
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


def energy_error(err: np.ndarray, band: float | None, path: Path, target: float | None = None) -> Path:
    """MCLMC's energy error per transition over sqrt(dimension), ``err [chain, draw]``: its
    trace and its histogram per chain (density on a log scale: a chain past its warm-up's aim
    shows as a heavy tail), with a normal of variance ``band`` (the pass band of its variance
    per dimension) for scale; each chain's mean square is given over ``target`` (the variance
    its warm-up aimed at) where there is one."""
    plt = pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.6), constrained_layout=True)
    finite = err[np.isfinite(err)]
    lim = max(float(np.max(np.abs(finite))) if finite.size else 1.0, 3 * np.sqrt(band) if band else 0.0)
    bins, top = np.linspace(-lim, lim, 121), 0.0
    for c, e in enumerate(err):
        ms = float(np.nanmean(e**2))
        over = f" ({ms / target:.2g}x the target)" if target else ""
        ax[0].plot(e, lw=0.6, color=f"C{c % 10}", label=f"chain {c}: mean square {ms:.2g}{over}")
        h, _, _ = ax[1].hist(e[np.isfinite(e)], bins=bins, density=True, histtype="step", color=f"C{c % 10}")
        top = max(top, float(np.max(h)) if h.size else 0.0)
    if band:
        x = np.linspace(-lim, lim, 200)
        ax[1].plot(x, np.exp(-0.5 * x**2 / band) / np.sqrt(2 * np.pi * band), "k--", lw=0.9,
                   label=f"normal, variance {band:g} (the pass band: energy_error_ratio_pass x the target)")
        ax[1].legend(fontsize=7)
        top = max(top, 1 / np.sqrt(2 * np.pi * band))
    if finite.size:  # from about a third of one draw's density to twice the highest
        ax[1].set_yscale("log")
        ax[1].set_ylim(0.3 / (finite.size / err.shape[0] * (bins[1] - bins[0])), 2 * top)
    ax[0].set_xlabel("draw (after warm-up)")
    ax[0].set_ylabel(r"energy error / $\sqrt{d}$")
    ax[0].legend(fontsize=7)
    ax[1].set_xlabel(r"energy error / $\sqrt{d}$")
    ax[1].set_ylabel("density")
    ax[0].set_title("MCLMC: the energy error of each transition", fontsize=10)
    return save_figure(fig, path)


# ---------------------------------------------------------------- the field


def field_pk(sp: dict, path: Path) -> Path:
    """P(k) of the white noise of the draws over the prior expectation (the cell volume);
    ``sp``: :func:`fli.infer.diagnose.fields.white_noise_spectra`."""
    plt = pyplot()
    k, q = sp["k"], sp["q"]
    fig, ax = plt.subplots(figsize=(6.4, 3.8), constrained_layout=True)
    ax.fill_between(k, q[0], q[4], color="C0", alpha=0.2, label="draws: 95%")
    ax.fill_between(k, q[1], q[3], color="C0", alpha=0.35, label="draws: 68%")
    ax.plot(k, q[2], "C0-", lw=1.2, label="draws: median")
    ax.plot(k, np.ones_like(k), "k-", lw=0.8, label="prior expectation (P = cell volume)")
    if sp["sigma"] is not None:
        ax.plot(k, 1 + sp["sigma"], "k:", lw=0.8, label=r"prior $\pm 1\sigma$ of one draw ($\sqrt{2/N_{modes}}$)")
        ax.plot(k, 1 - sp["sigma"], "k:", lw=0.8)
    if sp["truth"] is not None:
        ax.plot(k, sp["truth"], "C3--", lw=1.0, label="truth")
    _logk(ax)
    ax.set_xlabel("k [h/Mpc]")
    ax.set_ylabel("P(k) / cell volume")
    ax.set_title("white noise of the posterior draws", fontsize=10)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


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


def observed_maps(obs, mean_kappa, fov, path: Path) -> Path:
    """The observed kappa per bin (what the likelihood reads), the posterior's mean prediction of
    it, and their difference in units of the noise (0 where masked)."""
    plt = pyplot()
    kobs, sigma = np.asarray(obs.kappa_obs, float), np.asarray(obs.noise_sigma, float)
    mask = np.ones(kobs.shape[1:], bool) if obs.mask is None else np.asarray(obs.mask, bool)
    nb = kobs.shape[0]
    ext = (-fov / 2, fov / 2, -fov / 2, fov / 2)
    fig, axes = plt.subplots(3, nb, figsize=(3.4 * nb + 0.8, 9.0), squeeze=False, constrained_layout=True)
    for b in range(nb):
        lim = float(np.max(np.abs(kobs[b][mask]))) or 1.0
        res = np.where(mask, (kobs[b] - mean_kappa[b]) / sigma[b], 0.0)
        chi2 = float(np.mean(res[mask] ** 2))
        for r, (t, m, lo, hi, cm) in enumerate((
                ("observed", np.where(mask, kobs[b], np.nan), -lim, lim, "RdBu_r"),
                ("predicted (posterior mean)", mean_kappa[b], -lim, lim, "RdBu_r"),
                (f"(observed - predicted) / noise, mean square {chi2:.2f}", res, -3, 3, "PuOr_r"))):
            im = _img(axes[r, b], m.T, f"bin {b}: {t}", lo, hi, cm, ext)
            axes[r, b].set_xlabel("deg")
            fig.colorbar(im, ax=axes[r, b], shrink=0.8)
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


def r_of_k(rk: dict, path: Path) -> Path:
    """r(k) and T(k) of the posterior-mean white noise against the true one
    (:func:`fli.infer.diagnose.fields.mean_against_truth`)."""
    plt = pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    ax[0].plot(rk["k"], rk["r"], "C0o-", ms=3)
    ax[0].axhline(0, color="0.8", lw=0.6)
    ax[0].set_ylabel("r(k): posterior mean x truth")
    ax[0].set_ylim(-1.05, 1.05)  # the largest scales hold a few modes: r scatters over [-1, 1]
    ax[1].plot(rk["k"], rk["T"], "C1o-", ms=3)
    ax[1].axhline(1, color="0.8", lw=0.6)
    ax[1].set_ylabel("T(k) = sqrt(P_mean / P_truth)")
    for x in ax:
        _logk(x)
        x.set_xlabel("k [h/Mpc]")
    ax[0].set_title("white noise: the posterior mean against the truth", fontsize=10)
    return save_figure(fig, path)


def residuals(rows: list[dict], fov: float, path: Path) -> Path:
    """(observed - draw) / sigma per bin for a few thinned draws, with chi^2 per pixel
    (:func:`fli.infer.diagnose.fields.residuals`)."""
    plt = pyplot()
    nb = rows[0]["res"].shape[0]
    ext = (-fov / 2, fov / 2, -fov / 2, fov / 2)
    fig, axes = plt.subplots(len(rows), nb, figsize=(3.4 * nb + 1, 3.0 * len(rows)), squeeze=False,
                             constrained_layout=True)
    for r, row in enumerate(rows):
        for b in range(nb):
            im = _img(axes[r, b], row["res"][b].T, f"{Path(row['run']).name} draw {row['draw']}, bin {b}\n"
                      f"chi2 per pixel {row['chi2'][b]:.2f}", -3, 3, "RdBu_r", ext)
            axes[r, b].set_xlabel("deg")
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6, label="(observed - draw) / noise")
    return save_figure(fig, path)
