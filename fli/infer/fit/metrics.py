"""How well a recovered field and map match the truth: r(k), T(k), r_ell, and where they fall.

* 3D, all modes: ``r(k) = P_rt / sqrt(P_rr P_tt)`` and ``T(k) = sqrt(P_rr / P_tt)`` of the
  recovered and true linear fields, in shells of |k| (sharded spectra, :mod:`fli.sim.power`);
* 3D, inside the light cone: the same after multiplying both fields by the indicator of the
  cells the cone crosses (transverse distance within half the field of view times the depth,
  and nearer than the farthest source), so the cells the data cannot see do not dilute r;
* transverse modes: the light-cone-masked fields projected along the line of sight (the
  ``k_parallel = 0`` modes, the ones lensing constrains), r and T in shells of ``k_perp``;
* maps: ``r_ell`` per source bin of the recovered and true noiseless kappa (tapered, see
  :func:`fli.lensing.limber.map_power_spectrum`).

:func:`first_below` gives the first scale where a curve drops below 0.5.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from fli.lensing.limber import map_power_spectrum
from fli.sim.power import binned_spectra
from fli.sim.sharding import FIELD_SPEC, process_allgather


def _rt(p_rr, p_tt, p_rt):
    p_rr, p_tt, p_rt = (np.asarray(x, float) for x in (p_rr, p_tt, p_rt))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(p_rr * p_tt > 0, p_rt / np.sqrt(p_rr * p_tt), np.nan)
        t = np.where(p_tt > 0, np.sqrt(p_rr / p_tt), np.nan)
    return r, t


def cone_mask(fwd) -> jax.Array:
    """``[nx, ny, nz]`` 1 in the cells the light cone crosses, 0 elsewhere, ``P('x','y')``.

    Cell (i, j, l) is inside when its centre's transverse offset from the observer's axis is
    within ``fov/2 * z`` on both axes and ``z`` is nearer than the farthest used plane's far edge.
    """
    g, geom = fwd.grid, fwd.geometry
    nx, ny, nz = g.shape
    cx, cy, cz = (float(c) for c in g.cell)
    half = 0.5 * math.radians(geom.fov_deg)
    z_far = geom.plane_r[-1] + 0.5 * geom.dr
    bx, by, _ = g.local_shape

    def local():
        i = jax.lax.axis_index("x") * bx + jnp.arange(bx)
        j = jax.lax.axis_index("y") * by + jnp.arange(by)
        z = (jnp.arange(nz) + 0.5) * cz
        x = (i + 0.5) * cx - 0.5 * nx * cx
        y = (j + 0.5) * cy - 0.5 * ny * cy
        inx = jnp.abs(x)[:, None, None] <= half * z[None, None, :] + 0.5 * cx
        iny = jnp.abs(y)[None, :, None] <= half * z[None, None, :] + 0.5 * cy
        return (inx & iny & (z[None, None, :] < z_far)).astype(g.jdtype)

    return jax.jit(jax.shard_map(local, mesh=g.mesh, in_specs=(), out_specs=FIELD_SPEC, check_vma=False))()


def cross_spectra(a, b, plan, box, kedges=None) -> dict:
    """r(k) and T(k) of two fields in shells of |k| (``kedges``: None for the default bins):
    ``{"k", "r", "T", "n_modes"}`` (numpy; nan where a shell has no power)."""
    fa, fb = plan.rfft(a), plan.rfft(b)
    k, (prr, ptt, prt), n = binned_spectra(plan, box, [(fa, fa), (fb, fb), (fa, fb)], kedges)
    r, t = _rt(prr, ptt, prt)
    return {"k": np.asarray(k), "r": r, "T": t, "n_modes": np.asarray(n)}


def field_metrics(fwd, recovered, truth, kedges=None) -> dict:
    """r(k) and T(k) of two linear fields ``[nx, ny, nz]`` ``P('x','y')``: all modes, inside
    the light cone, and transverse modes of the cone (k_perp). Host numpy lists, k in h/Mpc."""
    g = fwd.grid
    plan = g.fft
    out = {}
    mask = cone_mask(fwd)
    for name, (a, b) in {"all": (recovered, truth), "cone": (recovered * mask, truth * mask)}.items():
        out[name] = {k: np.asarray(v).tolist() for k, v in cross_spectra(a, b, plan, g.box, kedges).items()}
    # transverse modes: project the cone-masked fields along z (small 2D maps)
    pa = process_allgather(jnp.sum(recovered * mask, axis=2))
    pb = process_allgather(jnp.sum(truth * mask, axis=2))
    k2, prr, ptt, prt, n2 = _spectra_2d(pa, pb, g.box[:2])
    r, t = _rt(prr, ptt, prt)
    out["transverse"] = {"k": k2.tolist(), "r": r.tolist(), "T": t.tolist(), "n_modes": n2.tolist()}
    for v in out.values():
        v["k_r_half"] = first_below(v["k"], v["r"])
        v["k_T_half"] = first_below(v["k"], v["T"])
    return out


def _spectra_2d(a, b, box2):
    nx, ny = a.shape
    kx = 2 * np.pi * np.fft.fftfreq(nx, box2[0] / nx)
    ky = 2 * np.pi * np.fft.rfftfreq(ny, box2[1] / ny)
    kk = np.hypot(kx[:, None], ky[None, :])
    fa, fb = np.fft.rfft2(a), np.fft.rfft2(b)
    kf = 2 * np.pi / max(box2)
    edges = np.arange(0.5, int(kk.max() / kf) + 1.5) * kf
    idx = np.digitize(kk.ravel(), edges) - 1
    nb = len(edges) - 1
    ok = (idx >= 0) & (idx < nb) & (kk.ravel() > 0)

    def avg(w):
        return np.bincount(idx[ok], weights=w.ravel()[ok], minlength=nb)

    n = np.bincount(idx[ok], minlength=nb).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        k = avg(kk) / n
        return k, avg(np.abs(fa) ** 2) / n, avg(np.abs(fb) ** 2) / n, avg((fa * np.conj(fb)).real) / n, n.astype(int)


def kappa_metrics(kappa_rec, kappa_true, fov_deg: float, n_bins_ell: int | None = None) -> dict:
    """Per-bin ``r_ell`` and ``T_ell`` of recovered and true maps ``[n_bins, npix, npix]`` (tapered)."""
    kr, kt = process_allgather(kappa_rec), process_allgather(kappa_true)
    nbe = n_bins_ell or max(4, kr.shape[-1] // 4)
    ell, crr, _ = map_power_spectrum(kr, fov_deg, nbe, taper=0.5)
    _, ctt, _ = map_power_spectrum(kt, fov_deg, nbe, taper=0.5)
    _, cpp, _ = map_power_spectrum(kr + kt, fov_deg, nbe, taper=0.5)
    crt = 0.5 * (cpp - crr - ctt)  # the cross spectrum from the spectrum of the sum
    r, t = _rt(crr, ctt, crt)
    return {"ell": np.asarray(ell).tolist(), "r": r.tolist(), "T": t.tolist(),
            "ell_r_half": [first_below(ell, rb) for rb in r]}


def first_below(x, y, level: float = 0.5):
    """The first ``x`` (linearly interpolated) where ``y`` drops below ``level``; None if never."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    below = np.nonzero(y < level)[0]
    if below.size == 0:
        return None
    i = int(below[0])
    if i == 0:
        return float(x[0])
    x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
    return float(x0 + (level - y0) * (x1 - x0) / (y1 - y0))
