"""The numbers fli-diagnose's figures show, computed here and drawn by
:mod:`fli.infer.diagnose.figures`.

* the mock's truth (its observation) and its parameters, derived ones included;
* S8 under the run's prior (sampled parameters through
  :class:`fli.infer.posterior.priors.PriorTransform`, the others at the run's ``cosmology``);
* the white noise's P(k) of the draws over the prior expectation (white noise of unit variance
  per cell: P = the cell volume), with the scatter of one draw, sqrt(2 / N_modes), and the
  truth's;
* from the chains' ``running.zarr``, the pooled posterior mean and variance of the white noise
  and of kappa, and r(k), T(k) of the posterior mean against the truth
  (:func:`fli.infer.fit.metrics.cross_spectra`, the fli-map metrics' own);
* residuals of thinned draws (``fields.zarr``) in units of the noise, with chi^2 per pixel.

Each returns plain numpy; what cannot be computed is said in ``notes``.
"""

from __future__ import annotations

import numpy as np

from fli.config import ConfigError
from fli.store.fingerprint import short
from fli.infer.posterior.params import names_of_run, with_derived
from fli.infer.sample.run_store import pooled_running, read_thinned_kappa


def truth_of(config: dict, notes: list[str], recorded: dict | None = None, mock: str | None = None):
    """The mock's observation (with its truth) that a run sampled, or None.

    ``mock``: the user's ``mock=`` (a run moved from another machine), else the run's config's.
    ``recorded``: the run's manifest's observation. A mock whose fingerprint differs from it is
    not the data the chains saw: refused (ConfigError) where the user named it, else left out
    with a note, so a path reused for another mock never lends the report a wrong truth."""
    from fli.store.io import load_observation  # noqa: PLC0415

    named = mock is not None
    mock = mock if named else config.get("mock")
    if not mock:
        notes.append("no mock in the run's config.yaml: no truth, no residual maps")
        return None
    try:
        obs = load_observation(mock)
    except (OSError, ValueError) as e:
        if named:
            raise ConfigError(f"mock={mock}: not a readable observation ({e})") from e
        notes.append(f"mock={mock} not readable ({e}): no truth, no residual maps")
        return None
    want = (recorded or {}).get("fingerprint")
    if want is not None and obs.fingerprint is not None and obs.fingerprint != want:
        what = (f"mock={mock} is not the observation the chains sampled (fingerprint {short(obs.fingerprint)}, "
                f"the run recorded {short(want)} at {(recorded or {}).get('path')})")
        if named:
            raise ConfigError(f"{what}: name the mock the run was made with")
        notes.append(f"{what}: no truth, no residual maps; give fli-diagnose mock=<that observation>")
        return None
    return obs


def reference_values(obs, names) -> dict | None:
    """The truth's value of each of ``names`` (derived ones included), or None."""
    if obs is None or obs.truth is None:
        return None
    t = with_derived(dict(obs.truth))
    return {k: float(t[k]) for k in names if k in t}


def prior_s8(config: dict, n: int = 20000, seed: int = 0) -> np.ndarray:
    """Draws of S8 under the run's prior: sampled parameters through PriorTransform, the
    others at the run's ``cosmology``."""
    return prior_draws(config, n, seed)["S8"]


def prior_draws(config: dict, n: int = 20000, seed: int = 0) -> dict[str, np.ndarray]:
    """Draws of every parameter under the run's prior, derived ones included: the sampled ones
    through PriorTransform, the others fixed at the run's ``cosmology``."""
    import jax  # noqa: PLC0415

    from fli.config import to_config  # noqa: PLC0415
    from fli.infer.config_keys import DIAGNOSE  # noqa: PLC0415
    from fli.infer.posterior.priors import PriorTransform  # noqa: PLC0415

    # fli-diagnose's own keys are dropped: they never shaped the run, and a run saved before one
    # of them was renamed (diagnose.energy_error_pass) would not validate
    cfg = to_config({k: v for k, v in config.items() if k != "hydra" and k not in DIAGNOSE})
    pt = PriorTransform.from_config(cfg.prior)
    return _with_fixed(cfg, pt.names, np.asarray(pt.sample(jax.random.PRNGKey(seed), (n,)), float))


def _with_fixed(cfg, names, x: np.ndarray) -> dict:
    """Draws ``x`` ``[n, len(names)]`` of the sampled parameters with the others fixed at the
    config's cosmology, derived parameters added."""
    p = {k: np.full(x.shape[0], v) for k, v in cfg.cosmology.parameters().items()}
    p.update({name: x[:, i] for i, name in enumerate(names)})
    return with_derived(p)


def latent_gaussian_draws(config: dict, mean_z, cov_z, n: int = 20000, seed: int = 0) -> dict:
    """Draws of a Gaussian in the standardised latents of the sampled parameters (MUSE's
    ``theta_z``, ``cov_z``) pushed through the run's PriorTransform, the others at the run's
    ``cosmology``, derived parameters included: MUSE's posterior as MUSE states it."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from fli.config import to_config  # noqa: PLC0415
    from fli.infer.config_keys import DIAGNOSE  # noqa: PLC0415
    from fli.infer.posterior.priors import PriorTransform  # noqa: PLC0415

    cfg = to_config({k: v for k, v in config.items() if k != "hydra" and k not in DIAGNOSE})
    pt = PriorTransform.from_config(cfg.prior)
    z = np.random.default_rng(seed).multivariate_normal(np.asarray(mean_z, float), np.asarray(cov_z, float), n)
    return _with_fixed(cfg, pt.names, np.asarray(jax.vmap(pt)(jnp.asarray(z, jnp.float32)), float))


def start_of(config: dict, notes: list[str]) -> dict | None:
    """The fli-map run that the chains started from (``init=<fli-map run directory>``): its joint
    MAP ``map`` with the Laplace marginal sds ``laplace_sd``, and MUSE's ``muse`` (``params``,
    ``sd``, its latent Gaussian ``theta_z``, ``cov_z``) where it ran; None for any other start."""
    import json  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    init = config.get("init")
    path = Path(str(init)) / "map.json" if init else None
    if path is None or not path.is_file():
        return None
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        notes.append(f"the start {init}: map.json not readable ({e}): no MAP or MUSE in the report")
        return None
    out = {"run": str(init), "map": m.get("params", {}), "muse": None,
           "laplace_sd": ((m.get("laplace") or {}).get("marginal") or {}).get("std", {})}
    mu = m.get("muse")
    if mu:
        out["muse"] = {"params": mu["params"], "sd": mu["sd"], "theta_z": mu["theta_z"], "cov_z": mu["cov_z"]}
    return out


def _grid(config: dict):
    """(FFT plan on one device, box [Mpc/h], cell volume [(Mpc/h)^3]) of a run's mesh."""
    from fli.sim.fft import make_fft  # noqa: PLC0415
    from fli.sim.sharding import make_mesh  # noqa: PLC0415

    sim = config["simulation"]
    shape, box = [int(n) for n in sim["mesh"]], [float(b) for b in sim["box"]]
    import jax  # noqa: PLC0415

    one = make_mesh((1, 1), devices=jax.local_devices()[:1])  # this process's own: diagnosis is one process's work
    return make_fft(one, shape, backend="pencil"), box, float(np.prod(box) / np.prod(shape))


def white_noise_spectra(pk_draws, k, config: dict, obs) -> dict:
    """P(k) of the draws' white noise over the cell volume: ``k``, the 2.5, 16, 50, 84, 97.5
    percentiles ``q`` over the draws, and where the bins are the run's default ones (the
    sampler's), one draw's scatter ``sigma`` = sqrt(2 / N_modes) and the truth's ``truth``
    (empty shells dropped)."""
    import jax.numpy as jnp  # noqa: PLC0415

    from fli.sim.power import default_kedges, power_spectrum  # noqa: PLC0415

    plan, box, vcell = _grid(config)
    k = np.asarray(k)
    pk = np.asarray(pk_draws).reshape(-1, k.size) / vcell
    edges = default_kedges(plan, box)
    _, _, nmodes = power_spectrum(jnp.zeros(plan.shape, jnp.float32), plan, box, edges)
    nmodes = np.asarray(nmodes, float)
    out = {"k": k, "sigma": None, "truth": None}
    if nmodes.size == k.size:  # shells without a mode (a long box has many) carry no P(k)
        keep = nmodes > 0
        k, pk, nmodes = k[keep], pk[:, keep], nmodes[keep]
        out.update(k=k, sigma=np.sqrt(2.0 / nmodes))
        if obs is not None and obs.white_noise is not None:
            _, pt, _ = power_spectrum(jnp.asarray(obs.white_noise, jnp.float32), plan, box, edges)
            out["truth"] = np.asarray(pt)[keep] / vcell
    out["q"] = np.percentile(pk, [2.5, 16, 50, 84, 97.5], axis=0)
    return out


def mean_against_truth(mean, truth, config: dict) -> dict:
    """r(k) and T(k) of the posterior-mean white noise against the true one (shells with
    modes only): ``{"k", "r", "T"}``."""
    import jax.numpy as jnp  # noqa: PLC0415

    from fli.infer.fit.metrics import cross_spectra  # noqa: PLC0415

    plan, box, _ = _grid(config)
    m = cross_spectra(jnp.asarray(mean, jnp.float32), jnp.asarray(truth, jnp.float32), plan, box)
    keep = np.asarray(m["n_modes"]) > 0  # shells without a mode carry nothing
    return {k: np.asarray(m[k])[keep] for k in ("k", "r", "T")}


def residuals(chains, obs, n: int) -> list[dict]:
    """Up to ``n`` thinned post-warm-up draws: ``{"run", "draw", "res" [bins, npix, npix],
    "chi2" [bins]}``, the residual (observed - draw) / sigma (0 where masked) and chi^2 per
    observed pixel."""
    draws = read_thinned_kappa([c.run for c in chains], [c.chunks for c in chains], n)
    kobs = np.asarray(obs.kappa_obs, np.float64)
    sigma = np.asarray(obs.noise_sigma, np.float64)
    mask = np.ones(kobs.shape[1:], bool) if obs.mask is None else np.asarray(obs.mask, bool)
    out = []
    for run, d, kap in draws:
        res = np.stack([np.where(mask, (kobs[b] - kap[b]) / sigma[b], 0.0) for b in range(kobs.shape[0])])
        out.append({"run": run, "draw": d, "res": res,
                    "chi2": [float(np.sum(r[mask] ** 2) / mask.sum()) for r in res]})
    return out


def figure_data(idata, chains, dcfg, notes: list[str], obs) -> dict:
    """Everything the figures need beyond the InferenceData: ``obs`` (or None), ``ref``,
    ``prior`` (draws of every parameter) and ``prior_s8``, ``start`` (:func:`start_of`) and
    ``muse_draws`` where MUSE ran, ``field_pk``, ``pooled`` (running.zarr, or None), ``r_k`` (or None),
    ``residuals``. ``obs``: :func:`truth_of`'s."""
    config = chains[0].config
    out = {"obs": obs, "ref": reference_values(obs, names_of_run(config)), "pooled": None, "r_k": None,
           "residuals": []}
    try:
        out["prior"] = prior_draws(config)
        out["prior_s8"] = out["prior"]["S8"]
    except Exception as e:  # noqa: BLE001  a config too old to rebuild its prior
        notes.append(f"s8_prior: no prior draws ({type(e).__name__}: {e})")
        out["prior"] = out["prior_s8"] = None
    out["start"] = start_of(config, notes)
    if out["start"] is not None and out["start"]["muse"] is not None:
        mu = out["start"]["muse"]
        try:
            out["muse_draws"] = latent_gaussian_draws(config, mu["theta_z"], mu["cov_z"])
        except Exception as e:  # noqa: BLE001  a covariance that is not one
            notes.append(f"MUSE's Gaussian not drawn ({type(e).__name__}: {e})")
    try:
        out["field_pk"] = white_noise_spectra(idata.field_summaries["pk_white_noise"], chains[0].k, config, obs)
    except Exception as e:  # noqa: BLE001
        notes.append(f"field_pk: not computed ({type(e).__name__}: {e})")
    pooled = pooled_running([c.run for c in chains], notes)
    out["pooled"] = pooled
    has_truth = obs is not None and obs.has_truth
    if pooled is not None:
        notes.append(f"field mean and standard deviation from running.zarr: {pooled['n']} post-warm-up draws "
                     "of the chains (each chain's draws to its last checkpoint, not truncated)")
        if has_truth:
            out["r_k"] = mean_against_truth(pooled["mean_white_noise"], np.asarray(obs.white_noise), config)
    if obs is not None and dcfg.residual_draws > 0:
        out["residuals"] = residuals(chains, obs, dcfg.residual_draws)
        if not out["residuals"]:
            notes.append("residuals: no thinned post-warm-up field draw in fields.zarr")
    return out
