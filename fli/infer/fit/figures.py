"""Figures of ``fli-map``: loss curve, kappa maps and residuals, and with a mock's truth the
transfer function and cross-correlation of the field, r_ell per bin and field slices.

Every process calls :func:`map_figures` (the gathers are collectives); process 0 draws.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from fli.plots import pyplot, save_figure
from fli.sim.sharding import process_allgather


def map_figures(run_dir: Path, post, obs, data, kappa, hist: np.ndarray, metrics: dict | None, lin) -> dict:
    """Draw the MAP's figures into ``run_dir``; returns ``{name: path}`` (empty off process 0).

    ``lin``: the recovered and the true linear field (None without a truth), drawn as slices."""
    g, geom = post.fwd.grid, post.fwd.geometry
    k_map = process_allgather(kappa)
    k_obs = process_allgather(data.kappa_obs)
    w = process_allgather(data.weight)
    slices = None
    if lin is not None:
        mid = jax.jit(lambda f: f[:, g.shape[1] // 2, :])
        slices = (process_allgather(mid(lin[1])), process_allgather(mid(lin[0])))
    if obs.has_truth:
        k_true = process_allgather(obs.kappa_true)
    if jax.process_index() != 0:
        return {}
    run_dir = Path(run_dir)
    out = {"loss": str(loss_curve(hist, run_dir / "loss.png"))}
    fov = geom.fov_deg
    out["kappa_maps"] = str(kappa_panels(k_map, k_true if obs.has_truth else None, k_obs, fov,
                                         run_dir / "kappa_maps.png"))
    out["residuals"] = str(residual_maps(k_obs, k_map, w, fov, run_dir / "residuals.png"))
    if metrics is not None:
        out["transfer"] = str(transfer(metrics["field"], run_dir / "transfer.png"))
        out["r_ell"] = str(r_ell(metrics["kappa"], run_dir / "r_ell.png"))
    if slices is not None:
        out["field_slices"] = str(field_slices(*slices, g.box, run_dir / "field_slices.png"))
    return out


def loss_curve(hist: np.ndarray, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    steps = np.arange(1, len(hist) + 1)
    loss = hist[:, 0]
    ax[0].plot(steps, loss - loss.min() + 1.0, lw=1.2)
    ax[0].set_yscale("log")
    ax[0].set_xlabel("step")
    ax[0].set_ylabel("loss - min(loss) + 1")
    for s in np.nonzero(np.diff(hist[:, 4]))[0]:
        ax[0].axvline(s + 1.5, color="0.6", ls=":", lw=0.8)
    ax[1].plot(steps, hist[:, 1], lw=1.2, color="C1")
    ax[1].set_yscale("log")
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("|gradient|")
    ax[0].set_title("negative log posterior (dotted: annealing stages)")
    return save_figure(fig, path)


def _imshow(ax, m, fov, title, vmin=None, vmax=None, cmap="viridis"):
    im = ax.imshow(m.T, origin="lower", extent=(-fov / 2, fov / 2, -fov / 2, fov / 2), vmin=vmin, vmax=vmax,
                   cmap=cmap)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("deg")
    return im


def kappa_panels(k_map, k_true, k_obs, fov, path: Path) -> Path:
    plt = pyplot()
    rows = [("observed", k_obs), ("MAP (noiseless)", k_map)]
    if k_true is not None:
        rows.append(("true (noiseless)", k_true))
    nb = k_map.shape[0]
    fig, axes = plt.subplots(len(rows), nb, figsize=(3.4 * nb, 3.0 * len(rows)), squeeze=False,
                             constrained_layout=True)
    for b in range(nb):
        lim = float(np.max(np.abs(k_true[b] if k_true is not None else k_map[b]))) or 1.0
        for r, (name, m) in enumerate(rows):
            im = _imshow(axes[r, b], m[b], fov, f"bin {b}: {name}", -lim, lim, "RdBu_r")
        fig.colorbar(im, ax=axes[:, b].tolist(), shrink=0.6, label=f"kappa (bin {b})")
    return save_figure(fig, path)


def residual_maps(k_obs, k_map, w, fov, path: Path) -> Path:
    plt = pyplot()
    nb = k_map.shape[0]
    fig, axes = plt.subplots(1, nb, figsize=(3.6 * nb + 1, 3.4), squeeze=False, constrained_layout=True)
    for b in range(nb):
        r = (k_obs[b] - k_map[b]) * w[b]
        n = max(int(np.sum(w[b] > 0)), 1)
        title = f"bin {b}: (obs - MAP) / sigma\nchi2 per pixel {np.sum(r ** 2) / n:.2f}"
        im = _imshow(axes[0, b], r, fov, title, -3, 3, "RdBu_r")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="residual / noise")
    return save_figure(fig, path)


def transfer(fm: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    for i, (name, label) in enumerate((("all", "all modes"), ("cone", "inside the light cone"),
                                       ("transverse", "transverse (k_par = 0), cone"))):
        d = fm[name]
        ax[0].plot(d["k"], d["r"], f"C{i}", label=label)
        ax[1].plot(d["k"], d["T"], f"C{i}", label=label)
    for a, lab in zip(ax, ("r(k)", "T(k)"), strict=True):
        a.axhline(0.5, color="0.6", ls=":", lw=0.8)
        a.axhline(1.0 if lab == "T(k)" else 0.0, color="0.8", lw=0.6)
        a.set_xscale("log")
        a.set_xlabel("k [h/Mpc]")
        a.set_ylabel(lab)
    ax[0].set_title("recovered vs true linear field")
    ax[0].legend(fontsize=8)
    return save_figure(fig, path)


def r_ell(km: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6), constrained_layout=True)
    ell = np.asarray(km["ell"])
    for b, rb in enumerate(km["r"]):
        ax.plot(ell, rb, f"C{b}o-", ms=3, label=f"bin {b}")
    ax.axhline(0.5, color="0.6", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("ell")
    ax.set_ylabel("r_ell (MAP vs true noiseless kappa)")
    ax.set_ylim(-0.2, 1.05)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def field_slices(true_slice, rec_slice, box, path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(10, 4.6), sharex=True, constrained_layout=True)
    lim = float(np.max(np.abs(true_slice))) or 1.0
    ext = (0, box[2], 0, box[0])
    for a, m, t in zip(axes, (true_slice, rec_slice), ("true", "MAP"), strict=True):
        im = a.imshow(m, origin="lower", extent=ext, aspect="auto", vmin=-lim, vmax=lim, cmap="RdBu_r")
        a.set_title(f"{t} linear field delta_L(a=1), slice y = Ly/2", fontsize=9)
        a.set_ylabel("x [Mpc/h]")
    axes[-1].set_xlabel("z (line of sight) [Mpc/h]")
    fig.colorbar(im, ax=axes.tolist(), shrink=0.8)
    return save_figure(fig, path)
