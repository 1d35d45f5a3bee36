"""Mock observations: draw the truth, run the forward model, add shape noise, write the result.

:func:`make_mock` runs the forward model the likelihood uses (:func:`fli.forward.build_forward`)
at the config's cosmology on the white noise of ``cfg.seed`` and adds shape noise drawn by
:func:`add_shape_noise`. :func:`write_mock` writes into a run directory: ``config.yaml``
(resolved), ``mock.zarr`` (see :mod:`fli.store.io`; readable with :func:`fli.store.io.load_mock` on any device
layout), ``summary.json`` and the figures of :func:`make_figures` (``kappa_maps.png``,
``matter_power.png``, ``kappa_cl.png``). The ``fli-mock`` command (:mod:`fli.cli.mock`) calls both.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from fli.config import Config, ConfigError


def add_shape_noise(seed: int, kappa, sigma, mask=None):
    """The mock's shape noise of ``seed`` on ``kappa``: :func:`fli.lensing.survey.add_noise` with the key
    ``fold_in(key(seed), 1)``, a stream independent of the white noise drawn from the same seed.

    ``sigma``: per-bin noise per pixel; ``mask``: as in :func:`fli.lensing.survey.add_noise`. Returns its
    :class:`fli.lensing.survey.NoisyKappa`; the same on every device layout.
    """
    from fli.lensing.survey import add_noise  # noqa: PLC0415

    return add_noise(jax.random.fold_in(jax.random.key(seed), 1), kappa, sigma, mask)


def make_mock(cfg: Config, log: logging.Logger | None = None) -> dict:
    """Run the forward model (:func:`fli.forward.build_forward`, the one the likelihood uses)
    at the config's truth on the white noise of ``cfg.seed``, add shape noise
    (:func:`add_shape_noise`) where the survey mask observes; returns the arrays and diagnostics.

    Raises :class:`fli.config.ConfigError` for a bad mask, or when particles overrun the halo and
    ``simulation.on_overflow`` is ``raise``."""
    from fli.forward import build_forward, fiducial_cosmology  # noqa: PLC0415
    from fli.sim.painting import check_halo  # noqa: PLC0415
    from fli.sim.sharding import white_noise  # noqa: PLC0415
    from fli.lensing.survey import load_mask, noise_sigma  # noqa: PLC0415

    log = log or logging.getLogger("fli")
    fwd = build_forward(cfg)
    cosmo, grid, geom = fiducial_cosmology(cfg), fwd.grid, fwd.geometry
    a_steps = np.asarray(geom.a_steps(fwd.a_start))
    try:
        mask = load_mask(cfg.survey, cfg.lensing.npix)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    log.info("grid %s cells over %s Mpc/h on pdims %s; %d lens planes to r = %.0f Mpc/h; %d PM steps "
             "a = %.3f -> %.3f (%s forward, %s light cone)", grid.shape, grid.box, grid.pdims, geom.n_used,
             geom.plane_r[-1] + geom.dr / 2, len(a_steps) - 1, a_steps[0], a_steps[-1], fwd.kind, fwd.lightcone)
    if geom.replicated:
        log.warning("%s", geom.replication_note())
    noise = white_noise(cfg.seed, grid.shape, grid.mesh, dtype=grid.jdtype)
    forward = jax.jit(lambda c, s: fwd(c, s, return_density=True))

    t0 = time.perf_counter()
    log.info("compiling and running the forward model (%s, %d lens planes, Born projection)...",
             "2LPT + %d PM steps" % (len(a_steps) - 1) if fwd.kind == "pm" else "linear", geom.n_used)
    kappa, aux = forward(cosmo, noise)
    jax.block_until_ready(kappa)
    t1 = time.perf_counter()
    max_disp = float(np.max(np.asarray(aux.max_disp)))
    log.info("forward model done in %.1f s; largest transverse displacement %.2f cells (halo %d)",
             t1 - t0, max_disp, grid.halo)
    try:
        check_halo(max_disp, grid.halo, cfg.simulation.on_overflow, grid.assignment)
    except ValueError as e:
        raise ConfigError(f"simulation.halo: {e}") from None
    sigma = noise_sigma(cfg.survey, cfg.lensing.fov_deg, cfg.lensing.npix)
    noisy = add_shape_noise(cfg.seed, kappa, sigma, mask)
    return dict(cosmo=cosmo, grid=grid, geom=geom, bins=list(fwd.bins), a_steps=a_steps, white_noise=noise,
                kappa_true=kappa, kappa_obs=noisy.kappa, noise_sigma=np.asarray(noisy.sigma),
                mask=None if mask is None else noisy.mask, density=aux.density, max_disp=max_disp,
                forward_s=t1 - t0)


def write_mock(run_dir: Path, cfg: Config, resolved: dict, m: dict, log: logging.Logger) -> Path:
    """Write the mock into ``run_dir`` (arrays per process, COMPLETE marker last) and figures."""
    from fli.store.fingerprint import recorded_fingerprint  # noqa: PLC0415
    from fli.store.io import FORMAT_VERSION, MOCK_NAME, mark_complete, write_arrays  # noqa: PLC0415
    from fli.store.manifest import write_manifest  # noqa: PLC0415

    run_dir = Path(run_dir)
    if jax.process_index() == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    truth = cfg.cosmology.parameters()
    arrays = {"kappa_obs": m["kappa_obs"], "kappa_true": m["kappa_true"], "white_noise": m["white_noise"],
              "noise_sigma": m["noise_sigma"]}
    if m["mask"] is not None:
        arrays["mask"] = np.asarray(m["mask"])
    # the n(z) tables of the bins that made it: a mock is an observation (docs/observation.md)
    arrays["nz_z"] = np.stack([np.asarray(b.z) for b in m["bins"]])
    arrays["nz"] = np.stack([np.asarray(b.nz) for b in m["bins"]])
    geom = m["geom"]
    attrs = {"fli_format": FORMAT_VERSION, "truth": truth, "config": resolved, "seed": cfg.seed,
             "fov_deg": float(cfg.lensing.fov_deg), "npix": int(cfg.lensing.npix),
             "n_gal": [float(b.n_gal) for b in m["bins"]],
             "plane_r": geom.plane_r.tolist(), "plane_a": geom.plane_a.tolist(),
             "a_steps": np.asarray(m["a_steps"]).tolist(), "units": {
                 "kappa": "convergence (dimensionless)", "white_noise": "unit Gaussian per cell",
                 "noise_sigma": "convergence per pixel", "nz_z": "redshift", "nz": "per unit redshift",
                 "n_gal": "arcmin^-2", "plane_r": "Mpc/h", "fov": "deg", "fov_deg": "deg"}}
    path = run_dir / MOCK_NAME
    write_arrays(path, arrays, attrs)
    figures = make_figures(run_dir, cfg, m)  # collective: every process computes, process 0 draws
    summary = {"max_disp_cells": m["max_disp"], "forward_s": m["forward_s"],
               "noise_sigma": m["noise_sigma"].tolist(), "n_planes_used": geom.n_used,
               "processes": jax.process_count(), "devices": jax.device_count(), "figures": figures,
               "replication": geom.replication_note()}
    if jax.process_index() == 0:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    mark_complete(path, summary)
    write_manifest(run_dir, "fli-mock", resolved, SimpleNamespace(path=path, fingerprint=recorded_fingerprint(path)))
    log.info("mock written to %s", path)
    return path


def make_figures(run_dir: Path, cfg: Config, m: dict) -> dict:
    """kappa maps, matter P(k) against linear theory and halofit, kappa C_ell against Limber
    (linear and halofit P(k)).

    The spectra of sharded fields are collectives, so every process runs this; only process 0
    draws and writes. Returns the figure paths.
    """
    from fli import plots  # noqa: PLC0415
    from fli.cosmo.background import a_of_chi  # noqa: PLC0415
    from fli.cosmo.halofit import halofit_power, halofit_power_grid  # noqa: PLC0415
    from fli.lensing.born import born_weights  # noqa: PLC0415
    from fli.lensing.limber import limber_cl_planes, map_power_spectrum  # noqa: PLC0415
    from fli.cosmo.linear_power import linear_power  # noqa: PLC0415
    from fli.sim.lpt import linear_field  # noqa: PLC0415
    from fli.lensing.particle_planes import shot_noise_cl  # noqa: PLC0415
    from fli.sim.power import power_spectrum  # noqa: PLC0415
    from fli.sim.sharding import process_allgather  # noqa: PLC0415

    grid, geom, cosmo = m["grid"], m["geom"], m["cosmo"]
    kt = process_allgather(m["kappa_true"])
    ko = process_allgather(m["kappa_obs"])
    a_end = float(m["a_steps"][-1])
    k, p_sim, _ = power_spectrum(m["density"] - 1.0, grid.fft, grid.box)
    # jitted, as the theory below: eagerly, op by op, the figures' numbers took 40 s of a small
    # mock's 55 (docs/benchmarks.md, "Start-up")
    lin = jax.jit(lambda c, s: linear_field(c, s, grid, a_end))(cosmo, m["white_noise"])
    _, p_lin, _ = power_spectrum(lin, grid.fft, grid.box)
    k = np.asarray(k)
    ell, cl, _ = map_power_spectrum(kt, cfg.lensing.fov_deg, n_bins_ell=max(4, cfg.lensing.npix // 4),
                                    taper=0.5)  # taper: the patch is not periodic
    ok = np.isfinite(ell) & np.all(np.isfinite(cl), axis=0)
    ell, cl = np.asarray(ell)[ok], np.asarray(cl)[:, ok]
    ell_t = np.geomspace(max(ell.min() / 2, 1.0), ell.max() * 1.5, 60)

    particles = cfg.lensing.planes == "particles" and cfg.simulation.forward == "pm"

    def theory(cosmo, bins, k, ell_t):
        p_th, p_hf = linear_power(cosmo, k, a_end), halofit_power(cosmo, k, a_end)
        # what the PM map should see: plane-sum Limber with the paint (CIC sinc^4, TSC sinc^6) and
        # bilinear read (sinc^4) windows (mesh planes only: particle planes are painted at the
        # pixels, and the figure leaves it out)
        cl_th = limber_cl_planes(cosmo, bins, ell_t, geom, mesh_window=8 if grid.assignment == "cic" else 10)
        cl_cont = limber_cl_planes(cosmo, bins, ell_t, geom)
        # the same plane sum with halofit's P(k): what the map would carry with all the small-scale power
        r = jnp.asarray(geom.plane_r)
        kp = ell_t[:, None] / r[None, :]
        a_r = a_of_chi(cosmo, r)
        boost = halofit_power_grid(cosmo, kp, a_r) / linear_power(cosmo, kp, a_r[None, :])
        cl_hf = limber_cl_planes(cosmo, bins, ell_t, geom, boost=boost)
        return p_th, p_hf, *(jnp.stack([c[b, b] for b in range(c.shape[0])]) for c in (cl_th, cl_cont, cl_hf))

    p_th, p_hf, cl_th, cl_cont, cl_hf = map(np.asarray, jax.jit(theory)(cosmo, m["bins"], jnp.asarray(k),
                                                                        jnp.asarray(ell_t)))
    k_nyq = float(np.pi / np.max(grid.cell))
    p_sim, p_lin = np.asarray(p_sim), np.asarray(p_lin)
    a_pix_sr = (np.deg2rad(cfg.lensing.fov_deg) / cfg.lensing.npix) ** 2
    noise_cl = (m["noise_sigma"] ** 2 * a_pix_sr)[:, None] * np.ones_like(ell_t)[None, :]
    shot_cl = None
    if particles:  # Poisson shot noise of the painted particles, over the sub-particles' number
        shot = shot_noise_cl(geom, np.asarray(born_weights(cosmo, geom, m["bins"]))) / cfg.lensing.subparticles ** 2
        shot_cl = shot[:, None] * np.ones_like(ell_t)[None, :]
    ell_lo = 2 * np.pi / np.deg2rad(cfg.lensing.fov_deg)
    ell_hi = 0.5 * np.pi * cfg.lensing.npix / np.deg2rad(cfg.lensing.fov_deg)
    if jax.process_index() != 0:
        return {}
    return {
        "kappa_maps": str(plots.kappa_maps(kt, ko, cfg.lensing.fov_deg, run_dir / "kappa_maps.png")),
        "matter_power": str(plots.matter_power(k, p_sim, p_lin, p_th, a_end, run_dir / "matter_power.png",
                                               k_nyq=k_nyq, p_halofit=p_hf, assignment=grid.assignment)),
        "kappa_cl": str(plots.kappa_cl(ell, cl, cl_cont, noise_cl, run_dir / "kappa_cl.png", ell_theory=ell_t,
                                       ell_range=(ell_lo, ell_hi), cl_windowed=None if particles else cl_th,
                                       cl_halofit=cl_hf, shot_cl=shot_cl)),
    }
