"""``fli-nuts``'s work: one chain of NUTS/HMC over (theta, s), in chunks, resumable.

The kernel sits behind the seam of :mod:`fli.infer.sampler`; this module owns the chunks,
the outputs, the checkpoints and the progress. Every process runs the same code and the same
jitted programs; process 0 writes the small files, each process its own blocks of the fields.

Run directory::

    config.yaml                 the resolved config
    checkpoints/<chunk>/        orbax: kernel state (warm-up adaptation and key inside), the
                                running field statistics and counters, after each chunk
    chunks/chunk_00003/         one per complete chunk (a directory renamed into place last):
      draws.npz                 draw index, warm-up flag, the sampled parameters, Omega_m, S8
      stats.npz                 diverging, energy, potential_energy, tree_depth, n_steps,
                                step_size, acceptance_rate, mean_accept_prob, gradient_evals
                                (cumulative), seconds (cumulative)
      spectra.npz               k, P(k) of the white noise and of the linear field per draw
      fields.zarr               every field_thin-th draw: white noise and noiseless kappa
    running.zarr                Welford mean and variance over all post-warm-up draws of the
                                white noise and of the noiseless kappa (replaced atomically)
    posterior.nc                ArviZ InferenceData of the complete chunks (netCDF, h5netcdf)
    nuts.json                   written last: what ran, how long, draws, divergences

A chunk is complete when ``chunks/chunk_<i>`` exists. The order per chunk is: write the chunk
aside (``chunks/.chunk_<i>.tmp``, each file written aside and renamed, a ``DONE`` file
last), save checkpoint ``<i>``, then rename the chunk into place. A run started again on the
same directory resumes from the last complete checkpoint; a chunk whose checkpoint exists but
whose rename was cut off is renamed then, and anything later is removed, so no chunk is lost
or written twice. On the same layout the resumed chain is the uninterrupted one, bit for bit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from fli.config import DIAGNOSE_KEYS, Config, ConfigError
from fli.infer import checkpoint as ckpt
from fli.infer.map import _write_text
from fli.infer.model import Latents, Posterior
from fli.infer.sampler import NumpyroKernel, StepInfo, make_kernel
from fli.io import _barrier

CHUNKS = "chunks"
RUNNING = "running.zarr"
POSTERIOR_NC = "posterior.nc"
NUTS_JSON = "nuts.json"
DONE = "DONE"
STAT_NAMES = ("diverging", "energy", "potential_energy", "tree_depth", "n_steps", "step_size", "acceptance_rate",
              "mean_accept_prob")
# keys that only extend, re-place or re-report a run: they may change between a run and its resume
MAY_CHANGE = ("inference.num_samples", "inference.map", "run_dir", "progress",
              "compilation_cache", "distributed", "name", "init", "inference.init_redraw", *DIAGNOSE_KEYS)


class Accum(NamedTuple):
    """Running statistics carried through the chunks (checkpointed with the kernel state); in
    the run's state every leaf has the chain axis first."""

    n: jax.Array  # post-warm-up draws counted (int32)
    mean_s: jax.Array
    m2_s: jax.Array
    mean_k: jax.Array
    m2_k: jax.Array
    grads: jax.Array  # gradient evaluations so far (int32), the start's included


class Draws(NamedTuple):
    """Per-draw outputs of a chunk (stacked: ``[n_draws, n_chains]``)."""

    params: dict
    info: StepInfo
    grads: jax.Array
    pk_s: jax.Array
    pk_lin: jax.Array


def _savez(path: Path, **arrays) -> None:
    """np.savez written aside, then renamed (process 0)."""
    if jax.process_index() == 0:
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, path)


def _host(x) -> np.ndarray:
    """A replicated (or fully addressable) array to numpy on every process."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(x.addressable_data(0))
    return np.asarray(x)


def take_chain(x, c: int, axis: int, spec):
    """Chain ``c`` of ``x`` along ``axis``: a sharded array stays where it is (``spec``: the
    slice's PartitionSpec), a host array is indexed."""
    if not isinstance(x, jax.Array):
        return np.take(np.asarray(x), c, axis=axis)
    from jax.sharding import NamedSharding  # noqa: PLC0415

    mesh = x.sharding.mesh if isinstance(x.sharding, NamedSharding) else None
    if mesh is None:
        return np.take(_host(x), c, axis=axis)
    return jax.jit(lambda a: jax.lax.index_in_dim(a, c, axis, keepdims=False),
                   out_shardings=NamedSharding(mesh, spec))(x)


def chain_run_dir(run_dir: Path, c: int, chains: int) -> Path:
    """Where chain ``c`` of a run writes its chunks: the run directory itself for one chain,
    ``chain_<c>/`` in it for ``inference.chains_per_run`` > 1."""
    return Path(run_dir) if chains == 1 else Path(run_dir) / f"chain_{c}"


def chain_keys(seed: int, chains: int):
    """Per chain ``(init key, kernel key)``; chain 0 of any run is the one chain of
    ``chains_per_run=1`` with the same seed (the others fold their index into the seed's key)."""
    base = jax.random.PRNGKey(seed)
    keys = [base if c == 0 else jax.random.fold_in(base, c) for c in range(chains)]
    pairs = [jax.random.split(k) for k in keys]
    return [p[0] for p in pairs], jnp.stack([p[1] for p in pairs])


# ================================================================ the start of the chain


def check_init_map(cfg: Config, map_dir: Path) -> dict:
    """The ``map.json`` of a fli-map run, after checking that it fitted this mock."""
    from fli.infer.map import MAP_JSON  # noqa: PLC0415

    mj = map_dir / MAP_JSON
    if not mj.is_file():
        raise ConfigError(f"init={map_dir}: no {MAP_JSON} there (not a finished fli-map run); give a fli-map run "
                          f"directory, 'prior' or 'truth'")
    saved = yaml.safe_load((map_dir / "config.yaml").read_text()) if (map_dir / "config.yaml").is_file() else {}
    theirs, ours = saved.get("mock"), cfg.mock
    if theirs is None or Path(theirs).resolve() != Path(ours).resolve():
        raise ConfigError(f"init={map_dir} is a MAP of mock={theirs}, not of mock={ours}: fit the MAP on this mock "
                          f"first (fli-map mock={ours}) or use init=prior")
    for key in ("simulation", "lensing", "survey", "prior"):
        if saved.get(key) is not None and _model_part(saved, key) != _model_part_cfg(cfg, key):
            raise ConfigError(f"init={map_dir} was fitted with another {key} config than this run: its MAP is not a "
                              f"point of this posterior (compare {map_dir}/config.yaml)")
    return json.loads(mj.read_text())


def _model_part(saved: dict, key: str):
    d = dict(saved[key])
    if key == "simulation":
        d.pop("adjoint", None)  # how gradients are taken does not change the posterior
    return d


def _model_part_cfg(cfg: Config, key: str):
    import dataclasses  # noqa: PLC0415

    return _model_part({key: json.loads(json.dumps(dataclasses.asdict(getattr(cfg, key))))}, key)


def redraw_free_modes(s_map, grid, key):
    """``s_map + sqrt(1 - W(k)) n``: the MAP field with the modes the data leave free redrawn.

    A MAP shrinks the modes the data do not constrain towards zero, so it lies off the
    posterior's typical set (|s|^2 << D). In the Gaussian, mode-diagonal approximation
    the MAP of a mode is the Wiener filter W(k) of the data, with ``E|s_map,k|^2 = W(k)`` (in
    units of the white noise) and posterior variance ``1 - W(k)``; W(k) is estimated from the
    MAP's own power spectrum per shell (clipped to [0, 1]) and the missing variance added as
    white noise ``n`` filtered by ``sqrt(1 - W)``. The result has unit power per shell again.
    """
    from fli.fft import kgrid_norm  # noqa: PLC0415
    from fli.power import power_spectrum  # noqa: PLC0415
    from fli.sharding import white_noise  # noqa: PLC0415

    k, pk, _ = jax.jit(lambda s: power_spectrum(s, grid.fft, grid.box))(s_map)
    w = np.clip(np.asarray(pk) / grid.cell_volume, 0.0, 1.0)
    k = np.asarray(k)
    noise = white_noise(int(jax.random.randint(key, (), 0, 2**30)), grid.shape, grid.mesh, dtype=grid.jdtype)

    def f(s, n):
        kn = kgrid_norm(grid.fft, grid.box, dtype=grid.dtype)
        amp = jnp.sqrt(1.0 - jnp.interp(kn, jnp.asarray(k, grid.jdtype), jnp.asarray(w, grid.jdtype)))
        return s + grid.fft.irfft(grid.fft.rfft(n) * amp.astype(grid.jdtype))

    return jax.jit(f, out_shardings=grid.sharding)(s_map, noise), {"k": k.tolist(), "W": w.tolist()}


POINT_SUFFIXES = (".json", ".npz")


def point_start(path: str, post: Posterior, k_field, k_theta, rest):
    """The flat latent at a given point: ``init=<file>.json`` of parameter values
    (``{"Omega_c": 0.3, "sigma8": 0.8}``) or ``init=<file>.npz`` of parameter values and/or
    ``white_noise`` (the grid's ``[nx, ny, nz]``). Parameters not given are drawn from their
    prior, and the white noise too when it is not given (every process reads the file and
    places only its own blocks)."""
    from fli.sharding import white_noise  # noqa: PLC0415

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


def initial_point(cfg: Config, post: Posterior, obs, key, log: logging.Logger):
    """The flat latent the chain starts from and a description of it (for nuts.json)."""
    from fli.sharding import white_noise  # noqa: PLC0415

    lay, grid = post.layout, post.fwd.grid
    how = (cfg.init or "prior").strip()
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
    from fli.infer.map import load_map_field  # noqa: PLC0415

    mj = check_init_map(cfg, map_dir)
    theta = jnp.asarray(post.theta_of(mj["params"]), grid.jdtype)
    s_map = load_map_field(map_dir, grid.mesh).astype(grid.jdtype)
    desc = {"init": str(map_dir), "redraw": cfg.inference.init_redraw}
    if cfg.inference.init_redraw == "wiener":
        s, w = redraw_free_modes(s_map, grid, k_field)
        desc["wiener_W"] = w
        log.info("start: the MAP of %s with the modes it leaves free redrawn (W(k) from its spectrum: %.2f at the "
                 "largest scale, %.2f at the smallest)", map_dir, w["W"][0], w["W"][-1])
    else:
        s = s_map
        log.warning("start: the MAP of %s as it is (inference.init_redraw=none): its unconstrained modes sit near "
                    "zero, off the typical set, and the warm-up must move them", map_dir)
    return lay.pack(theta, s, rest), desc


# ================================================================ the chunk program


def _welford(acc: Accum, s, kappa, w) -> Accum:
    n = acc.n + w
    inv = jnp.where(n > 0, 1.0 / jnp.maximum(n, 1).astype(s.dtype), 0.0)
    ds = s - acc.mean_s
    mean_s = acc.mean_s + w * ds * inv
    m2_s = acc.m2_s + w * ds * (s - mean_s)
    dk = kappa - acc.mean_k
    mean_k = acc.mean_k + w * dk * inv
    m2_k = acc.m2_k + w * dk * (kappa - mean_k)
    return acc._replace(n=n, mean_s=mean_s, m2_s=m2_s, mean_k=mean_k, m2_k=m2_k)


def make_chunk(kernel: NumpyroKernel, post: Posterior, n: int, thin: int, num_warmup: int, kedges):
    """Jitted ``(state, acc, data) -> (state, acc, Draws, fields)`` for ``n`` draws of every
    chain (the state and ``acc`` have the chain axis first; each draw is ``jax.vmap`` ped over
    it); ``fields`` holds the white noise and kappa of every ``thin``-th draw
    (``[n // thin, n_chains, ...]``)."""
    from jax.sharding import NamedSharding  # noqa: PLC0415
    from jax.sharding import PartitionSpec as P  # noqa: PLC0415

    from fli.cosmology import growth_factor  # noqa: PLC0415
    from fli.lpt import linear_modes  # noqa: PLC0415
    from fli.power import binned_spectra  # noqa: PLC0415

    grid = post.fwd.grid

    def one_chain(state, acc, data):
        state, info = kernel.step(state, data)
        theta, s = kernel.latents(state)
        kappa, _ = post.predict(Latents(theta, s))
        w = (kernel.iteration(state) > num_warmup).astype(jnp.int32)
        acc = _welford(acc, s, kappa, w)
        acc = acc._replace(grads=acc.grads + info.num_steps.astype(jnp.int32))
        cosmo = post.cosmology(theta)
        # both spectra from k-space in one binning pass: the linear field's modes are the white
        # noise's times sqrt(P) (no round trip through real space)
        s_k, lin_k = grid.fft.rfft(s), linear_modes(cosmo, s, grid)
        _, (pk_s, pk_lin), _ = binned_spectra(grid.fft, grid.box, [(s_k, s_k), (lin_k, lin_k)], kedges)
        pk_lin = pk_lin * growth_factor(cosmo, jnp.asarray(1.0, grid.jdtype)) ** 2
        out = Draws(post.params(theta), info, acc.grads, pk_s, pk_lin)
        return state, acc, out, s, kappa

    from fli.lensing import MAP_SPEC  # noqa: PLC0415

    s_sh = NamedSharding(grid.mesh, P(None, *grid.sharding.spec))
    k_sh = NamedSharding(grid.mesh, P(None, *MAP_SPEC))

    def one(carry, data):
        state, acc, out, s, kappa = jax.vmap(one_chain, in_axes=(0, 0, None))(*carry, data)
        return (state, acc), out, jax.lax.with_sharding_constraint(s, s_sh), jax.lax.with_sharding_constraint(kappa,
                                                                                                             k_sh)

    def group(carry, data, length):
        def body(c, _):
            c, out, s, kappa = one(c, data)
            return c, (out, s, kappa)

        carry, (outs, ss, ks) = jax.lax.scan(body, carry, None, length=length)
        return carry, outs, ss[-1], ks[-1]

    def chunk(state, acc, data):
        carry = (state, acc)
        outs, fields = [], None
        n_groups, tail = divmod(n, thin)
        if n_groups:
            def g(c, _):
                c, o, s, k = group(c, data, thin)
                return c, (o, s, k)

            carry, (o, ss, ks) = jax.lax.scan(g, carry, None, length=n_groups)
            outs.append(jax.tree.map(lambda x: x.reshape(n_groups * thin, *x.shape[2:]), o))
            fields = (ss, ks)
        if tail:
            def t(c, _):
                c, o, _, _ = one(c, data)
                return c, o

            carry, o = jax.lax.scan(t, carry, None, length=tail)
            outs.append(o)
        draws = outs[0] if len(outs) == 1 else jax.tree.map(lambda *x: jnp.concatenate(x), *outs)
        return carry[0], carry[1], draws, fields

    return jax.jit(chunk, donate_argnums=(0, 1))


def zero_accum(post: Posterior, chains: int = 1) -> Accum:
    """Empty running statistics for ``chains`` chains (chain axis first)."""
    from jax.sharding import NamedSharding  # noqa: PLC0415
    from jax.sharding import PartitionSpec as P  # noqa: PLC0415

    from fli.lensing import MAP_SPEC  # noqa: PLC0415

    g = post.fwd.grid
    ksh = NamedSharding(g.mesh, P(None, *MAP_SPEC))
    ssh = NamedSharding(g.mesh, P(None, *g.sharding.spec))
    rep = NamedSharding(g.mesh, P())

    def z():
        zs = jnp.zeros((chains, *g.shape), g.jdtype)
        zk = jnp.zeros((chains, *post.fwd.map_shape), g.jdtype)
        zi = jnp.zeros((chains,), jnp.int32)
        return Accum(zi, zs, zs, zk, zk, zi)

    return jax.jit(z, out_shardings=Accum(rep, ssh, ssh, ksh, ksh, rep))()


# ================================================================ files


def chunk_dir(run_dir: Path, i: int) -> Path:
    return run_dir / CHUNKS / f"chunk_{i:05d}"


def _tmp_chunk_dir(run_dir: Path, i: int) -> Path:
    return run_dir / CHUNKS / f".chunk_{i:05d}.tmp"


def complete_chunks(run_dir: Path) -> list[int]:
    """Indices of the complete chunks of a run directory, in order."""
    d = Path(run_dir) / CHUNKS
    if not d.is_dir():
        return []
    out = []
    for p in d.iterdir():
        if p.name.startswith("chunk_") and p.is_dir() and (p / DONE).is_file():
            out.append(int(p.name.split("_")[1]))
    return sorted(out)


def tidy_chunks(run_dir: Path, last: int | None, log: logging.Logger) -> None:
    """Make the chunks agree with checkpoint ``last`` (process 0): finish a rename cut off
    after the checkpoint, remove everything later and every other temporary."""
    if jax.process_index() == 0:
        d = run_dir / CHUNKS
        if d.is_dir():
            for p in sorted(d.iterdir()):
                if p.name.startswith(".chunk_") and p.name.endswith(".tmp"):
                    i = int(p.name[len(".chunk_"):-len(".tmp")])
                    if last is not None and i <= last and (p / DONE).is_file() and not chunk_dir(run_dir, i).exists():
                        p.rename(chunk_dir(run_dir, i))
                        log.info("chunk %d was saved but not yet marked complete: marked now", i)
                    else:
                        shutil.rmtree(p)
                elif p.name.startswith("chunk_"):
                    i = int(p.name.split("_")[1])
                    if last is None or i > last:
                        log.warning("removing %s: it is later than the last checkpoint", p)
                        shutil.rmtree(p)
    _barrier("fli-nuts-tidy")


def write_chunk(run_dir: Path, i: int, first_draw: int, num_warmup: int, names, draws: Draws, fields,
                thin: int, k, seconds: np.ndarray, grid_info: dict) -> Path:
    """Write chunk ``i`` aside (every process: the fields are written per block)."""
    from fli.io import write_arrays  # noqa: PLC0415

    tmp = _tmp_chunk_dir(run_dir, i)
    if jax.process_index() == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    _barrier("fli-nuts-chunk-dir")
    n = int(np.shape(_host(draws.grads))[0])
    idx = np.arange(first_draw, first_draw + n)
    params = {k2: _host(v) for k2, v in draws.params.items()}
    _savez(tmp / "draws.npz", draw=idx, warmup=idx < num_warmup, **params)
    info = draws.info
    stats = {"diverging": _host(info.diverging), "energy": _host(info.energy),
             "potential_energy": _host(info.potential_energy), "tree_depth": _host(info.tree_depth),
             "n_steps": _host(info.num_steps), "step_size": _host(info.step_size),
             "acceptance_rate": _host(info.accept_prob), "mean_accept_prob": _host(info.mean_accept_prob),
             "gradient_evals": _host(draws.grads), "seconds": seconds}
    _savez(tmp / "stats.npz", draw=idx, **stats)
    _savez(tmp / "spectra.npz", draw=idx, k=np.asarray(k), pk_white_noise=_host(draws.pk_s),
           pk_linear=_host(draws.pk_lin))
    if fields is not None:
        kept = idx[thin - 1::thin][: fields[0].shape[0]]
        write_arrays(tmp / "fields.zarr", {"white_noise": fields[0], "kappa": fields[1]},
                     {"draw": kept.tolist(), "warmup": (kept < num_warmup).tolist(), **grid_info})
    _barrier("fli-nuts-chunk-written")
    if jax.process_index() == 0:
        (tmp / DONE).write_text(json.dumps({"chunk": i, "draws": [int(idx[0]), int(idx[-1])]}))
    _barrier("fli-nuts-chunk-done")
    return tmp


def mark_chunk(run_dir: Path, i: int) -> None:
    if jax.process_index() == 0:
        _tmp_chunk_dir(run_dir, i).rename(chunk_dir(run_dir, i))
    _barrier("fli-nuts-chunk-marked")


def write_running(run_dir: Path, acc: Accum, grid_info: dict) -> None:
    """``running.zarr``: the Welford mean and variance, replaced atomically."""
    from fli.io import write_arrays  # noqa: PLC0415

    n = int(_host(acc.n))
    denom = max(n - 1, 1)
    tmp = run_dir / (RUNNING + ".tmp")
    write_arrays(tmp, {"mean_white_noise": acc.mean_s, "var_white_noise": acc.m2_s / denom,
                       "mean_kappa": acc.mean_k, "var_kappa": acc.m2_k / denom},
                 {"n_draws": n, **grid_info})
    if jax.process_index() == 0:
        final = run_dir / RUNNING
        old = run_dir / (RUNNING + ".old")
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        if old.exists():
            shutil.rmtree(old)
    _barrier("fli-nuts-running")


def read_chunks(run_dir: Path, which=None) -> dict:
    """The draws, stats and spectra of the complete chunks, concatenated (numpy)."""
    run_dir = Path(run_dir)
    out: dict = {"draws": {}, "stats": {}, "spectra": {}}
    for i in (complete_chunks(run_dir) if which is None else which):
        for part in out:
            with np.load(chunk_dir(run_dir, i) / f"{part}.npz") as f:
                for name in f.files:
                    out[part].setdefault(name, []).append(f[name])
    for d in out.values():
        for name, v in d.items():
            d[name] = v[0] if name == "k" else np.concatenate(v)
    return out


def kappa_summary(obs) -> dict:
    """Per-bin mean, standard deviation and pixel count of the observed kappa (every process
    calls it: a sharded map is reduced where it lives, only scalars come back)."""
    k = obs.kappa_obs
    mask = None if obs.mask is None else np.asarray(obs.mask, bool)
    if isinstance(k, jax.Array) and not k.is_fully_addressable:
        mean = _host(jax.jit(lambda x: jnp.mean(x, axis=(1, 2)))(k))
        std = _host(jax.jit(lambda x: jnp.std(x, axis=(1, 2)))(k))
        n = np.full(mean.shape, k.shape[1] * k.shape[2])
    else:
        a = np.asarray(k, np.float64)
        m = np.ones(a.shape[1:], bool) if mask is None else mask
        mean, std = a[:, m].mean(1), a[:, m].std(1)
        n = np.full(mean.shape, int(m.sum()))
    return {"kappa_obs_mean": np.asarray(mean, np.float64), "kappa_obs_std": np.asarray(std, np.float64),
            "kappa_obs_pixels": n}


def write_inference_data(run_dir: Path, post: Posterior, obs, attrs: dict) -> Path | None:
    """``posterior.nc`` from the complete chunks (process 0; replaced atomically)."""
    if jax.process_index() != 0:
        return None
    with _quiet_arviz():
        return _write_inference_data(run_dir, post, obs, attrs)


@contextlib.contextmanager
def _quiet_arviz():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ's refactor notice and its automatic-dims notes
        logging.getLogger("arviz").setLevel(logging.WARNING)  # "arviz_base not installed" chatter
        yield


def _write_inference_data(run_dir: Path, post: Posterior, obs, attrs: dict) -> Path | None:
    import arviz as az  # noqa: PLC0415

    c = read_chunks(run_dir)
    if not c["draws"]:
        return None
    warm = c["draws"]["warmup"].astype(bool)
    names = [*post.names, "Omega_m", "S8"]

    def split(d, keys, mask):
        return {k: np.asarray(d[k])[mask][None] for k in keys}

    stat_keys = ["diverging", "energy", "potential_energy", "tree_depth", "n_steps", "step_size", "acceptance_rate",
                 "gradient_evals"]
    st = dict(c["stats"])
    st["lp"] = -st["potential_energy"]
    stat_keys.append("lp")
    spec = c["spectra"]
    obs_summary = {"noise_sigma": np.asarray(obs.noise_sigma, np.float64).reshape(-1), **attrs.pop("_observed")}
    post_w = ~warm
    idata = az.from_dict(
        posterior=split(c["draws"], names, post_w) if post_w.any() else None,
        sample_stats=split(st, stat_keys, post_w) if post_w.any() else None,
        warmup_posterior=split(c["draws"], names, warm) if warm.any() else None,
        warmup_sample_stats=split(st, stat_keys, warm) if warm.any() else None,
        observed_data=obs_summary,
        save_warmup=bool(warm.any()),
        attrs={k: (json.dumps(v) if not isinstance(v, (str, int, float)) else v) for k, v in attrs.items()},
    )
    if post_w.any():
        pk = {"pk_white_noise": spec["pk_white_noise"][post_w][None], "pk_linear": spec["pk_linear"][post_w][None]}
        idata.add_groups({"field_summaries": pk}, coords={"k_bin": np.arange(len(spec["k"]))},
                         dims={"pk_white_noise": ["k_bin"], "pk_linear": ["k_bin"]})
        idata.field_summaries.attrs["k"] = json.dumps(np.asarray(spec["k"]).tolist())
    tmp = run_dir / (POSTERIOR_NC + ".tmp")
    idata.to_netcdf(str(tmp), engine="h5netcdf")
    os.replace(tmp, run_dir / POSTERIOR_NC)
    return run_dir / POSTERIOR_NC


# ================================================================ the command


def _kernel(cfg: Config, post: Posterior) -> NumpyroKernel:
    i = cfg.inference
    return make_kernel(post, i.sampler, kernel=i.kernel, num_warmup=i.num_warmup, target_accept=i.target_accept,
                       max_tree_depth=i.max_tree_depth, num_steps=i.num_steps, step_size=i.step_size)


def _state(kstate, acc: Accum) -> dict:
    return {"kernel": kstate, "acc": acc}


def run_nuts(cfg: Config, resolved: dict, run_dir: Path, log: logging.Logger) -> dict:
    """Sample (or resume) the run's chains into ``run_dir``; returns the content of ``nuts.json``."""
    from jax.sharding import NamedSharding  # noqa: PLC0415
    from jax.sharding import PartitionSpec as P  # noqa: PLC0415

    from fli.infer.layout import FLAT_SPEC  # noqa: PLC0415
    from fli.infer.map import prepare  # noqa: PLC0415
    from fli.lensing import MAP_SPEC  # noqa: PLC0415
    from fli.power import default_kedges  # noqa: PLC0415

    run_dir = Path(run_dir)
    icfg = cfg.inference
    n_chains = icfg.chains_per_run
    obs, post, data = prepare(cfg, log, compare_truth=False)
    total = icfg.num_warmup + icfg.num_samples
    ckpt_dir = run_dir / "checkpoints"
    last = ckpt.latest_step(ckpt_dir)  # a collective: every process asks
    meta = None
    if last is not None:
        meta = ckpt.read_meta(ckpt_dir, last)
        # runs made before inference.sampler existed all sampled the flat, sharded latent
        meta["config"].setdefault("inference", {}).setdefault("sampler", "sharded")
        ckpt.check_resumable(meta["config"], resolved, MAY_CHANGE, where=f"run_dir {run_dir}")
        if (run_dir / NUTS_JSON).exists() and meta["draws"] >= total:
            # a sweep started again after a crash passes over its finished jobs: nothing is rewritten
            log.info("run_dir %s already holds a finished run of %d draws (%s): nothing to do; raise "
                     "inference.num_samples to extend it", run_dir, meta["draws"], NUTS_JSON)
            return json.loads((run_dir / NUTS_JSON).read_text())
    grid, lay = post.fwd.grid, post.layout
    chain_dirs = [chain_run_dir(run_dir, c, n_chains) for c in range(n_chains)]
    kernel = _kernel(cfg, post)
    k_inits, k_kernels = chain_keys(cfg.seed, n_chains)
    zsh = NamedSharding(grid.mesh, P(None, *FLAT_SPEC))
    t0 = time.perf_counter()
    if last is None:
        starts = [initial_point(cfg, post, obs, k, log) for k in k_inits]
        init_desc = starts[0][1]
        z0 = jax.jit(lambda *zs: jnp.stack(zs), out_shardings=zsh)(*[z for z, _ in starts])
        del starts
        kstate = kernel.init(z0, k_kernels, data)
        acc = zero_accum(post, n_chains)
        acc = acc._replace(grads=acc.grads + 1)
        done, seconds0, chunk0 = 0, 0.0, 0
    else:
        z0 = jax.ShapeDtypeStruct((n_chains, lay.size), grid.jdtype, sharding=zsh)
        template = _state(kernel.state_template(z0, k_kernels, data), zero_accum(post, n_chains))
        if list(meta["pdims"]) != list(grid.pdims) and kernel.layout_dependent:
            from fli.infer.relayout import restore_on_new_layout  # noqa: PLC0415

            state = restore_on_new_layout(ckpt_dir, last, template, meta, post, kernel)
        else:
            state, _ = ckpt.restore_checkpoint(ckpt_dir, last, template)
        kstate, acc = state["kernel"], Accum(*state["acc"])
        done, seconds0, chunk0, init_desc = int(meta["draws"]), float(meta["seconds"]), last + 1, meta["init"]
        log.info("resuming after chunk %d (%d draws done; saved on pdims %s, now %s)", last, done, meta["pdims"],
                 list(grid.pdims))
    for d in chain_dirs:
        tidy_chunks(d, last, log)
    if jax.process_index() == 0:
        for d in dict.fromkeys([run_dir, *chain_dirs]):
            d.mkdir(parents=True, exist_ok=True)
            _write_text(d / "config.yaml", yaml.safe_dump(resolved, sort_keys=False))
    if done >= total:
        log.info("nothing to do: %d draws done of %d", done, total)
    kedges = default_kedges(grid.fft, grid.box)
    k_centres = 0.5 * (kedges[1:] + kedges[:-1])
    grid_info = {"shape": list(grid.shape), "box": list(grid.box), "pdims": list(grid.pdims)}
    names = post.names
    programs: dict[int, object] = {}
    log.info("%s on %d latents (%s field, %s, %d warm-up + %d draws in chunks of %d; %s forward, %s light cone%s); "
             "start: %s", icfg.kernel.upper(), post.dim, "x".join(map(str, grid.shape)),
             ", ".join(names), icfg.num_warmup, icfg.num_samples, icfg.chunk, post.fwd.kind, post.fwd.lightcone,
             f"; {n_chains} vectorised chains" if n_chains > 1 else "",
             init_desc.get("init") if isinstance(init_desc, dict) else init_desc)
    observed = kappa_summary(obs)  # a collective where the map is sharded over processes
    attrs = {"config": yaml.safe_dump(resolved, sort_keys=False), "pdims": list(grid.pdims),
             "layout": ("flat P(('x','y')), per-device [field block | tail]" if icfg.sampler == "sharded"
                        else "NumPyro's ravel of (theta, field)"), "kernel": icfg.kernel, "sampler": icfg.sampler,
             "energy_offset": post.energy_offset + 0.5 * kernel.dim, "init": init_desc}
    i = chunk0
    t_start = time.perf_counter()
    n_div_post = sum(_count_post_divergences(d) for d in chain_dirs)
    s_spec, k_spec = P(None, *grid.sharding.spec), P(None, *MAP_SPEC)
    while done < total:
        n = min(icfg.chunk, total - done)
        if n not in programs:
            tc = time.perf_counter()
            prog = make_chunk(kernel, post, n, icfg.field_thin, icfg.num_warmup, kedges)
            programs[n] = prog.lower(kstate, acc, data).compile()
            log.info("compiled the %d-draw chunk program in %.1f s", n, time.perf_counter() - tc)
        tc = time.perf_counter()
        kstate, acc, draws, fields = programs[n](kstate, acc, data)
        jax.block_until_ready(kstate)
        dt = time.perf_counter() - tc
        seconds = seconds0 + dt * (np.arange(1, n + 1) / n)
        host = jax.tree.map(_host, draws)  # replicated per-draw scalars [n, chains]
        for c, d in enumerate(chain_dirs):
            f_c = None if fields is None else (take_chain(fields[0], c, 1, s_spec), take_chain(fields[1], c, 1, k_spec))
            write_chunk(d, i, done, icfg.num_warmup, names, jax.tree.map(lambda x, c=c: x[:, c], host), f_c,
                        icfg.field_thin, k_centres, seconds, grid_info)
            write_running(d, _accum_of_chain(acc, c, grid), grid_info)
        done += n
        seconds0 += dt
        meta = {"config": resolved, "draws": done, "chunk": i, "pdims": list(grid.pdims), "seconds": seconds0,
                "init": init_desc, "time": time.time(), "layout_size": lay.size, "n_params": post.prior.n,
                "chains": n_chains}
        ckpt.save_checkpoint(ckpt_dir, i, _state(kstate, acc), meta)
        for d in chain_dirs:
            mark_chunk(d, i)
        for d in chain_dirs:
            write_inference_data(d, post, obs, {**attrs, "seconds": seconds0, "_observed": dict(observed)})
        if n_chains > 1:
            write_combined_inference_data(run_dir, chain_dirs)
        post_mask = np.arange(done - n, done) >= icfg.num_warmup
        n_div_post += int(np.sum(np.asarray(host.info.diverging)[post_mask]))
        _progress(log, icfg, done, total, host, acc, dt / n, n_div_post, time.perf_counter() - t_start, i, chunk0)
        i += 1
    summaries = [_summary(d, icfg, post, seconds0, init_desc, time.perf_counter() - t0) for d in chain_dirs]
    if n_chains == 1:
        summary = summaries[0]
    else:
        for d, sm in zip(chain_dirs, summaries, strict=True):
            _write_text(d / NUTS_JSON, json.dumps(sm, indent=1))
        summary = _combined_summary(summaries, chain_dirs)
    _write_text(run_dir / NUTS_JSON, json.dumps(summary, indent=1))
    log.info("done: %d chain(s) of %d draws (%d after warm-up), %d divergences after warm-up, %d gradient "
             "evaluations, %.1f s sampling; %s", n_chains, summaries[0]["draws"], summaries[0]["draws_post_warmup"],
             sum(sm["divergences_post_warmup"] for sm in summaries), sum(sm["gradient_evals"] for sm in summaries),
             seconds0, run_dir)
    return summary


def _accum_of_chain(acc: Accum, c: int, grid) -> Accum:
    from fli.lensing import MAP_SPEC  # noqa: PLC0415

    s_spec, k_spec = grid.sharding.spec, MAP_SPEC
    return Accum(_host(acc.n)[c], take_chain(acc.mean_s, c, 0, s_spec), take_chain(acc.m2_s, c, 0, s_spec),
                 take_chain(acc.mean_k, c, 0, k_spec), take_chain(acc.m2_k, c, 0, k_spec), _host(acc.grads)[c])


def write_combined_inference_data(run_dir: Path, chain_dirs: list[Path]) -> Path | None:
    """``posterior.nc`` of a run of several chains: the chains' own files along ``chain``
    (process 0; replaced atomically)."""
    if jax.process_index() != 0:
        return None
    with _quiet_arviz():
        import arviz as az  # noqa: PLC0415
        import xarray as xr  # noqa: PLC0415

        parts = [az.from_netcdf(str(d / POSTERIOR_NC)) for d in chain_dirs]
        groups = {}
        for g in parts[0].groups():
            if g == "observed_data":
                groups[g] = parts[0][g]
                continue
            ds = xr.concat([p[g] for p in parts], dim="chain")
            groups[g] = ds.assign_coords(chain=np.arange(len(parts)))
        idata = az.InferenceData(**groups)
        idata.attrs.update(parts[0].attrs)
        idata.attrs["chains"] = json.dumps([str(d.name) for d in chain_dirs])
        tmp = run_dir / (POSTERIOR_NC + ".tmp")
        idata.to_netcdf(str(tmp), engine="h5netcdf")
        for p in parts:
            p.close()
    os.replace(tmp, run_dir / POSTERIOR_NC)
    return run_dir / POSTERIOR_NC


def _combined_summary(summaries: list[dict], chain_dirs: list[Path]) -> dict:
    s0 = summaries[0]
    out = {k: s0[k] for k in ("kernel", "draws", "draws_post_warmup", "num_warmup", "chunks", "seconds_sampling",
                              "seconds_this_run", "init", "dim", "pdims", "energy_note", "warmup_note")}
    out.update(chains_per_run=len(summaries),
               divergences_post_warmup=sum(s["divergences_post_warmup"] for s in summaries),
               gradient_evals=sum(s["gradient_evals"] for s in summaries),
               chains={d.name: {k: s[k] for k in ("divergences_post_warmup", "gradient_evals", "step_size",
                                                  "mean_tree_depth", "params_mean")}
                       for d, s in zip(chain_dirs, summaries, strict=True)},
               vectorised_note="the chains advance together in one program: a draw of all of them takes as long as "
                               "the deepest tree among them, so seconds_sampling is the run's, not per chain")
    return out


def _count_post_divergences(run_dir: Path) -> int:
    c = read_chunks(run_dir) if complete_chunks(run_dir) else None
    if not c:
        return 0
    return int(np.sum(c["stats"]["diverging"][~c["draws"]["warmup"].astype(bool)]))


def _progress(log, icfg, done, total, draws: Draws, acc: Accum, per_draw, n_div, elapsed, i, chunk0) -> None:
    """One line per chunk (rank 0); ``draws`` on the host, ``[n, chains]``; with several
    chains the step size is each chain's and the rest is over all of them."""
    info = draws.info
    warm = min(done, icfg.num_warmup)
    left = (total - done) * per_draw
    steps = np.atleast_1d(np.asarray(info.step_size)[-1])
    log.info("chunk %d: draws %d/%d (warm-up %d/%d), step size %s, tree depth %.1f (max %d), accept %.2f, "
             "divergences after warm-up %d, gradient evaluations %d, %.2f s/draw, %s left", i, done, total, warm,
             icfg.num_warmup, " ".join(f"{x:.3g}" for x in steps), float(np.mean(info.tree_depth)),
             int(np.max(info.tree_depth)), float(np.mean(info.accept_prob)), n_div,
             int(np.sum(_host(acc.grads))), per_draw, _fmt_time(left))


def _fmt_time(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _summary(run_dir: Path, icfg, post: Posterior, seconds: float, init_desc, wall: float) -> dict:
    c = read_chunks(run_dir)
    warm = c["draws"]["warmup"].astype(bool)
    st = c["stats"]
    return {
        "kernel": icfg.kernel, "sampler": icfg.sampler, "draws": int(warm.size),
        "draws_post_warmup": int((~warm).sum()),
        "num_warmup": icfg.num_warmup, "chunks": len(complete_chunks(run_dir)),
        "divergences_post_warmup": int(st["diverging"][~warm].sum()),
        "gradient_evals": int(st["gradient_evals"][-1]), "seconds_sampling": seconds, "seconds_this_run": wall,
        "step_size": float(st["step_size"][-1]), "mean_tree_depth": float(np.mean(st["tree_depth"][~warm]))
        if (~warm).any() else None,
        "params_mean": {k: float(np.mean(c["draws"][k][~warm])) for k in [*post.names, "Omega_m", "S8"]}
        if (~warm).any() else None,
        "init": init_desc, "dim": post.dim, "pdims": list(post.fwd.grid.pdims),
        "energy_note": "energies are H minus a constant offset (attrs.energy_offset of posterior.nc): "
                       "float64 sums of float32 fields, see fli/infer/energy.py",
        "warmup_note": "num_warmup from inference.num_warmup; NumPyro's windowed adaptation of the step size "
                       "and the diagonal mass matrix runs over it",
    }

