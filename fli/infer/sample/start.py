"""Where a chain starts: the prior, the mock's truth, a point file, or a fli-map run's MAP.

:func:`initial_point` returns the flat latent (:mod:`fli.infer.posterior.layout`) and a description of
the start for the run's summary. From a MAP the chain starts at its field (``init_redraw=none``,
the default) or, with ``init_redraw=wiener``, with the modes the data leave free redrawn
(:func:`redraw_free_modes`); that redraw's |k|-shell W(k) is ~0 for lensing, so it adds noise to
the modes the data fix as well, and the parameters then ran to the prior's edges
(scripts/studies/start_collapse.py, docs/benchmarks.md).
Every start is drawn from the run's seed (:func:`chain_keys`), so a run started again is the
same chain.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from fli.config import Config, ConfigError
from fli.infer.config_keys import MODEL_NEUTRAL, MODEL_PARTS, differences, show
from fli.infer.fit.map import MAP_JSON, load_map_field
from fli.infer.posterior.model import Posterior
from fli.store.manifest import check_same_observation, kind_of, read_manifest

POINT_SUFFIXES = (".json", ".npz")


def chain_keys(seed: int, chains: int):
    """Per chain ``(init key, kernel key)``; chain 0 of any run is the one chain of
    ``chains_per_run=1`` with the same seed (the others fold their index into the seed's key)."""
    base = jax.random.PRNGKey(seed)
    keys = [base if c == 0 else jax.random.fold_in(base, c) for c in range(chains)]
    pairs = [jax.random.split(k) for k in keys]
    return [p[0] for p in pairs], jnp.stack([p[1] for p in pairs])


def check_init_map(cfg: Config, map_dir: Path, obs) -> dict:
    """The ``map.json`` of a fli-map run, after checking that it fitted this observation (by
    its fingerprint) with this model."""
    kind = kind_of(map_dir)
    if kind not in (None, "fli-map"):
        raise ConfigError(f"init={map_dir} is a {kind} run, not a fli-map run: give a fli-map run directory, "
                          f"'prior' or 'truth'")
    mj = map_dir / MAP_JSON
    if not mj.is_file():
        raise ConfigError(f"init={map_dir}: no {MAP_JSON} there (not a finished fli-map run); give a fli-map run "
                          f"directory, 'prior' or 'truth'")
    saved = yaml.safe_load((map_dir / "config.yaml").read_text()) if (map_dir / "config.yaml").is_file() else {}
    recorded = (read_manifest(map_dir) or {}).get("observation")
    if recorded is None and saved.get("mock") is None:
        raise ConfigError(f"init={map_dir} records no observation: fit the MAP on this mock first "
                          f"(fli-map mock={cfg.mock}) or use init=prior")
    try:
        check_same_observation(recorded, obs, f"init={map_dir}", legacy_path=saved.get("mock"))
    except ConfigError as e:
        raise ConfigError(f"{e} (fit the MAP on this observation first: fli-map mock={cfg.mock})") from None
    ours_cfg = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    diff = differences({k: saved[k] for k in MODEL_PARTS if saved.get(k) is not None}, ours_cfg, only=[
        k for k in MODEL_PARTS if saved.get(k) is not None], ignore=MODEL_NEUTRAL)
    if diff:
        key, theirs_v, ours_v = diff[0]
        raise ConfigError(f"init={map_dir} was fitted with {key} = {show(theirs_v)}, this run has {show(ours_v)}: its "
                          f"MAP is not a point of this posterior (compare {map_dir}/config.yaml)")
    return json.loads(mj.read_text())


def redraw_free_modes(s_map, grid, key):
    """``s_map + sqrt(1 - W(k)) n``: the MAP field with the modes the data leave free redrawn.

    A MAP shrinks the modes the data do not constrain towards zero, so it lies off the
    posterior's typical set (|s|^2 << D). In the Gaussian, mode-diagonal approximation
    the MAP of a mode is the Wiener filter W(k) of the data, with ``E|s_map,k|^2 = W(k)`` (in
    units of the white noise) and posterior variance ``1 - W(k)``; W(k) is estimated from the
    MAP's own power spectrum per shell (clipped to [0, 1]) and the missing variance added as
    white noise ``n`` filtered by ``sqrt(1 - W)``. The result has unit power per shell again.
    """
    from fli.sim.fft import kgrid_norm  # noqa: PLC0415
    from fli.sim.power import power_spectrum  # noqa: PLC0415
    from fli.sim.sharding import white_noise  # noqa: PLC0415

    k, pk, _ = jax.jit(lambda s: power_spectrum(s, grid.fft, grid.box))(s_map)
    w = np.clip(np.asarray(pk) / grid.cell_volume, 0.0, 1.0)
    k = np.asarray(k)
    noise = white_noise(int(jax.random.randint(key, (), 0, 2**30)), grid.shape, grid.mesh, dtype=grid.jdtype)

    def f(s, n):
        kn = kgrid_norm(grid.fft, grid.box, dtype=grid.dtype)
        amp = jnp.sqrt(1.0 - jnp.interp(kn, jnp.asarray(k, grid.jdtype), jnp.asarray(w, grid.jdtype)))
        return s + grid.fft.irfft(grid.fft.rfft(n) * amp.astype(grid.jdtype))

    return jax.jit(f, out_shardings=grid.sharding)(s_map, noise), {"k": k.tolist(), "W": w.tolist()}



def start_theta(how: str, mj: dict, map_dir, post: Posterior, key, otherwise: str):
    """Where a chain started from the fli-map run ``map_dir`` (its ``map.json`` is ``mj``) takes
    theta (``inference.init_theta``) and its field: ``(theta_z [n], field store name, label)``.

    * ``map``: the joint MAP's theta (biased: sigma8 several of its widths high, docs/map.md);
    * ``prior``: a draw of the prior (the standard normal of the latent);
    * ``muse``: a draw of N(MUSE's estimate, its covariance), in the standardised latent, with
      the data's field MAP at the estimate (``muse_field.zarr``) where the run wrote one;
    * ``auto``: ``muse`` where the run has a MUSE estimate, else ``otherwise``.
    """
    from fli.infer.fit.map import FIELD_NAME  # noqa: PLC0415
    from fli.infer.muse.run import FIELD as MUSE_FIELD  # noqa: PLC0415
    from fli.store.io import COMPLETE  # noqa: PLC0415

    if how == "auto":
        how = "muse" if "muse" in mj else otherwise
    if how == "map":
        return np.asarray(post.theta_of(mj["params"]), np.float64), FIELD_NAME, "map"
    if how == "prior":
        return np.asarray(jax.random.normal(key, (post.prior.n,)), np.float64), FIELD_NAME, "prior"
    if "muse" not in mj:
        raise ConfigError(f"inference.init_theta=muse: {map_dir}/{MAP_JSON} holds no MUSE estimate (fit one with "
                          f"fli-map inference.map.estimator=muse), or set inference.init_theta to auto, map or prior")
    m = mj["muse"]
    mean, cov = np.asarray(m["theta_z"], np.float64), np.asarray(m["cov_z"], np.float64)
    theta = mean + np.linalg.cholesky(cov) @ np.asarray(jax.random.normal(key, mean.shape), np.float64)
    field = MUSE_FIELD if (Path(map_dir) / MUSE_FIELD / COMPLETE).is_file() else FIELD_NAME
    return theta, field, "muse"


def point_start(path: str, post: Posterior, k_field, k_theta, rest):
    """The flat latent at a given point: ``init=<file>.json`` of parameter values
    (``{"Omega_c": 0.3, "sigma8": 0.8}``) or ``init=<file>.npz`` of parameter values and/or
    ``white_noise`` (the grid's ``[nx, ny, nz]``). Parameters not given are drawn from their
    prior, and the white noise too when it is not given (every process reads the file and
    places only its own blocks)."""
    from fli.sim.sharding import white_noise  # noqa: PLC0415

    lay, grid = post.layout, post.fwd.grid
    f = Path(path)
    if not f.is_file():
        raise ConfigError(f"init={path}: no such file (a point is a .json of parameter values or a .npz of "
                          f"parameter values and/or white_noise)")
    try:
        if f.suffix == ".json":
            values = json.loads(f.read_text())
            if not isinstance(values, dict):
                raise ValueError("not a JSON object")
        else:
            with np.load(f) as z:
                values = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise ConfigError(f"init={path}: unreadable ({type(e).__name__}: {e})") from None
    valid = [*post.names, *(["white_noise"] if f.suffix == ".npz" else [])]
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ConfigError(f"init={path}: unknown key(s) {unknown}; valid: {valid} (the sampled parameters"
                          f"{' and the white noise' if f.suffix == '.npz' else ''})")
    given = [n for n in post.names if n in values]
    for n in given:
        v = np.asarray(values[n], np.float64)
        if v.size != 1 or not np.isfinite(v).all():
            raise ConfigError(f"init={path}: {n} must be one finite number, got {values[n]!r}")
    # the parameters not given at a prior draw: physical values of standard-normal latents
    drawn = np.asarray(post.prior(jax.random.normal(k_theta, (post.prior.n,), jnp.float32)), np.float64)
    point = {n: (float(np.asarray(values[n]).reshape(())) if n in values else float(drawn[i]))
             for i, n in enumerate(post.names)}
    try:
        theta = post.theta_of(point)  # outside a prior's support: a ConfigError naming the parameter
    except ConfigError as e:
        raise ConfigError(f"init={path}: {e}") from None
    if "white_noise" in values:
        w = np.asarray(values["white_noise"])
        if tuple(w.shape) != tuple(grid.shape) or not np.isfinite(w).all():
            raise ConfigError(f"init={path}: white_noise must be a finite array of the grid's shape "
                              f"{list(grid.shape)}, got shape {list(w.shape)}")
        w = w.astype(grid.dtype)
        s = jax.make_array_from_callback(tuple(grid.shape), grid.sharding, lambda idx: w[idx])
    else:
        s = white_noise(int(jax.random.randint(k_field, (), 0, 2**30)), grid.shape, grid.mesh, dtype=grid.jdtype)
    desc = {"init": str(path), "given": [*given, *(["white_noise"] if "white_noise" in values else [])],
            "drawn_from_prior": [n for n in post.names if n not in given]
            + ([] if "white_noise" in values else ["white_noise"])}
    return lay.pack(jnp.asarray(theta, grid.jdtype), s, rest), desc


def check_init_theta(cfg: Config) -> None:
    """``inference.init_theta`` other than auto needs ``init=<a fli-map run directory>``."""
    how = (cfg.init or "prior").strip()
    if cfg.inference.init_theta != "auto" and (how in ("prior", "truth") or not Path(how).is_dir()):
        raise ConfigError(f"inference.init_theta={cfg.inference.init_theta} chooses theta from a fli-map run, but "
                          f"init={how} is none: set init=<a fli-map run directory> or inference.init_theta=auto")


# the largest field (tiny's 16 x 16 x 64 cells) on which chains from the prior were seen to arrive;
# above it they ran to the prior's edges (docs/nuts.md, "Large fields")
PRIOR_START_CELLS = 16 * 16 * 64


def warn_prior_start(cfg: Config, post: Posterior, log: logging.Logger) -> None:
    """One line where chains start from the prior on a field where that is known to fail."""
    cells = int(np.prod(post.fwd.grid.shape))
    if (cfg.init or "prior").strip() == "prior" and cells > PRIOR_START_CELLS:
        log.warning("init=prior on a field of %d cells: above %d cells chains from the prior ran to the prior's "
                    "edges (docs/nuts.md, 'Large fields'); start them from a MAP: init=<fli-map run dir>, or run "
                    "fli-pipeline", cells, PRIOR_START_CELLS)


def initial_point(cfg: Config, post: Posterior, obs, key, log: logging.Logger):
    """The flat latent the chain starts from and a description of it (for nuts.json)."""
    from fli.sim.sharding import white_noise  # noqa: PLC0415

    lay, grid = post.layout, post.fwd.grid
    how = (cfg.init or "prior").strip()
    check_init_theta(cfg)
    k_field, k_rest = jax.random.split(key)
    rest = jax.jit(lambda k: jax.random.normal(k, (lay.size,), grid.jdtype), out_shardings=lay.sharding)(k_rest)
    if how == "prior":
        seed = int(jax.random.randint(k_field, (), 0, 2**30))
        s = white_noise(seed, grid.shape, grid.mesh, dtype=grid.jdtype)
        theta = jax.random.normal(jax.random.fold_in(k_rest, 1), (post.prior.n,), grid.jdtype)
        return lay.pack(theta, s, rest), {"init": "prior"}
    if how == "truth":
        if not getattr(obs, "has_truth", False):
            raise ConfigError(f"init=truth but mock={cfg.mock} has no truth (white_noise and parameters)")
        theta = jnp.asarray(post.theta_of(obs.truth), grid.jdtype)
        return lay.pack(theta, obs.white_noise.astype(grid.jdtype), rest), {"init": "truth"}
    map_dir = Path(how)
    if map_dir.suffix in POINT_SUFFIXES:
        return point_start(how, post, k_field, jax.random.fold_in(k_rest, 1), rest)
    if not map_dir.is_dir():
        raise ConfigError(f"init={how}: not 'prior', 'truth', a point file (.json or .npz) or a fli-map run "
                          f"directory")
    mj = check_init_map(cfg, map_dir, obs)
    theta, field, label = start_theta(cfg.inference.init_theta, mj, map_dir, post, jax.random.fold_in(k_rest, 2),
                                      "map")
    theta = jnp.asarray(theta, grid.jdtype)
    s_map = load_map_field(map_dir, grid.mesh, field).astype(grid.jdtype)
    desc = {"init": str(map_dir), "redraw": cfg.inference.init_redraw, "theta": label, "field": field}
    if label != "map":
        log.info("start: theta from %s (%s), the field from %s/%s", label,
                 ", ".join(f"{k}={float(v):.4f}" for k, v in post.params(theta).items()), map_dir, field)
    if cfg.inference.init_redraw == "wiener":
        s, w = redraw_free_modes(s_map, grid, k_field)
        desc["wiener_W"] = w
        log.info("start: the MAP of %s with the modes it leaves free redrawn (W(k) from its spectrum: %.2f at the "
                 "largest scale, %.2f at the smallest)", map_dir, w["W"][0], w["W"][-1])
    else:
        s = s_map
        log.info("start: the field of %s as it is (inference.init_redraw=none): the warm-up moves the modes the "
                 "data leave free off zero", map_dir)
    return lay.pack(theta, s, rest), desc
