"""Figures of the run products (matplotlib, Agg backend; called on process 0 only)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def pyplot():
    """pyplot, with the Agg backend chosen above."""
    return plt


def save_figure(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` (written aside, then renamed) and close it."""
    path = Path(path)
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    tmp.rename(path)
    return path


def kappa_colour_limits(kappa_true: np.ndarray, kappa_obs: np.ndarray) -> tuple[float, float]:
    """Symmetric colour limits of one bin's noiseless and observed maps: each the 99.5th percentile
    of |kappa|, the observed one never below the noiseless one. Where noise dominates the observed
    map takes the noise's range; where the signal does, both maps share one scale, so the signal
    reads alike in both (a fixed multiple of the noiseless range washed it out at low shape noise)."""
    lim = float(np.percentile(np.abs(kappa_true), 99.5)) or 1.0
    return lim, max(lim, float(np.percentile(np.abs(kappa_obs), 99.5)))


def kappa_maps(kappa_true: np.ndarray, kappa_obs: np.ndarray, fov_deg: float, path: Path,
               labels: list[str] | None = None) -> Path:
    """Noiseless and observed convergence per bin, side by side ``[n_bins, npix, npix]``."""
    nb = kappa_true.shape[0]
    fig, axes = plt.subplots(2, nb, figsize=(3.6 * nb + 0.6, 6.6), squeeze=False, constrained_layout=True)
    ext = [-fov_deg / 2, fov_deg / 2, -fov_deg / 2, fov_deg / 2]
    for b in range(nb):
        lims = kappa_colour_limits(kappa_true[b], kappa_obs[b])
        for row, (m, what) in enumerate(((kappa_true[b], "noiseless"), (kappa_obs[b], "observed"))):
            ax = axes[row, b]
            im = ax.imshow(m.T, origin="lower", extent=ext, cmap="RdBu_r", vmin=-lims[row], vmax=lims[row])
            name = labels[b] if labels else f"bin {b}"
            ax.set_title(f"{name}: {what}", fontsize=9)
            ax.set_xlabel(r"$\theta_x$ [deg]")
            ax.set_ylabel(r"$\theta_y$ [deg]")
            fig.colorbar(im, ax=ax, shrink=0.8, label=r"$\kappa$")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def matter_power(k: np.ndarray, p_sim: np.ndarray, p_lin_realisation: np.ndarray, p_theory: np.ndarray,
                 a: float, path: Path, k_nyq: float | None = None, p_halofit: np.ndarray | None = None,
                 assignment: str = "cic") -> Path:
    """3D P(k) of the final particle field (painted with ``assignment``) against linear theory and
    halofit at the same scale factor."""
    fig, (ax, axr) = plt.subplots(2, 1, figsize=(6, 6.2), sharex=True, height_ratios=[3, 1.3],
                                  constrained_layout=True)
    sel = p_sim > 0
    ax.loglog(k[sel], p_sim[sel], "C0-", label=f"PM ({assignment.upper()}-painted particles)")
    ax.loglog(k[sel], p_lin_realisation[sel], "C1--", label="linear field, same realisation")
    ax.loglog(k[sel], p_theory[sel], "k:", label="linear theory $P_{EH}(k)$")
    if p_halofit is not None:
        ax.loglog(k[sel], p_halofit[sel], "k-", lw=0.8, label="halofit (Takahashi 2012)")
    ax.set_ylabel(r"$P(k)$ [$(h^{-1}$Mpc$)^3$]")
    ax.set_title(f"matter power at a = {a:.3f}", fontsize=10)
    ax.legend(fontsize=8)
    axr.semilogx(k[sel], p_sim[sel] / p_lin_realisation[sel], "C0-", label="PM / linear (same realisation)")
    if p_halofit is not None:
        axr.semilogx(k[sel], p_halofit[sel] / p_theory[sel], "k-", lw=0.8, label="halofit / linear")
        axr.legend(fontsize=7)
    axr.axhline(1, color="k", lw=0.6)
    axr.set_ylabel("over linear")
    axr.set_xlabel(r"$k$ [$h$/Mpc]")
    axr.xaxis.set_minor_formatter(plt.NullFormatter())
    if k_nyq:
        for a_ in (ax, axr):
            a_.axvline(k_nyq, color="grey", lw=0.6, ls="--")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def kappa_cl(ell: np.ndarray, cl_maps: np.ndarray, cl_theory: np.ndarray, noise_cl: np.ndarray,
             path: Path, ell_theory: np.ndarray | None = None, ell_range: tuple[float, float] | None = None,
             cl_windowed: np.ndarray | None = None, cl_halofit: np.ndarray | None = None,
             shot_cl: np.ndarray | None = None) -> Path:
    """Angular power spectra per bin: noiseless map, Limber prediction with the linear P(k)
    (and with the PM mesh window) and with halofit's, shape-noise level, and (particle planes)
    the particles' Poisson shot-noise level."""
    nb = cl_maps.shape[0]
    ell_t = ell if ell_theory is None else ell_theory
    fig, axes = plt.subplots(1, nb, figsize=(4.2 * nb, 3.8), squeeze=False, constrained_layout=True)
    for b in range(nb):
        ax = axes[0, b]
        sel = cl_maps[b] > 0
        ax.loglog(ell[sel], (ell * (ell + 1) * cl_maps[b] / (2 * np.pi))[sel], "C0o-", ms=3, label="noiseless map")
        ax.loglog(ell_t, ell_t * (ell_t + 1) * cl_theory[b] / (2 * np.pi), "k:", label="Limber (linear P)")
        if cl_halofit is not None:
            ax.loglog(ell_t, ell_t * (ell_t + 1) * cl_halofit[b] / (2 * np.pi), "k-", lw=0.8,
                      label="Limber (halofit P)")
        if cl_windowed is not None:
            w = cl_windowed[b] > 1e-3 * cl_theory[b]
            ax.loglog(ell_t[w], (ell_t * (ell_t + 1) * cl_windowed[b] / (2 * np.pi))[w], "k--",
                      label="Limber x PM mesh window")
        ax.loglog(ell_t, ell_t * (ell_t + 1) * noise_cl[b] / (2 * np.pi), "C3:", label="shape noise")
        if shot_cl is not None:
            ax.loglog(ell_t, ell_t * (ell_t + 1) * shot_cl[b] / (2 * np.pi), "C1-.", lw=0.8,
                      label="particle shot noise (Poisson), in the map")
        if ell_range:
            ax.axvspan(*ell_range, color="C2", alpha=0.08, label=r"$2\pi$/fov to half the map Nyquist")
        ax.set_xlabel(r"$\ell$")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())  # the minor labels of a short log axis overlap
        ax.set_ylabel(r"$\ell(\ell+1)C_\ell/2\pi$")
        ax.set_title(f"bin {b}", fontsize=10)
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
