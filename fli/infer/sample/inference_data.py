"""ArviZ InferenceData of sampling runs: ``posterior.nc`` of a chain, of a run's chains, and
the groups fli adds (``field_summaries``: P(k) of each draw's white noise and linear field).

Every file is written by process 0, aside, and renamed into place. ArviZ 0.23 prints a
refactoring notice and notes on automatic dims at import and on every conversion;
:func:`quiet_arviz` silences them wherever fli calls it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fli.store.files import is_writer
from fli.infer.posterior.params import reported_names
from fli.infer.sample.run_store import POSTERIOR_NC, read_chunks
from fli.sim.sharding import replicated_to_host

STAT_KEYS = ("diverging", "energy", "potential_energy", "tree_depth", "n_steps", "step_size", "acceptance_rate",
             "energy_error", "turning", "gradient_evals", "lp", "max_disp")  # the last 3: absent from older runs
SPECTRA = ("pk_white_noise", "pk_linear")
PROJECTIONS = "projections"  # spectra.npz's data-constrained projections of each draw [n, K], where recorded


@contextlib.contextmanager
def quiet_arviz():
    """Import ArviZ (and use it) without its notices."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ's refactor notice and its automatic-dims notes
        # its import chatter, and "Shape validation failed" for one chain (whose NaN R-hat fails
        # the check anyway); set again after the import, which sets the level of its own logger
        for name in ("arviz", "arviz.preview"):
            logging.getLogger(name).setLevel(logging.ERROR)
        import arviz  # noqa: PLC0415

        for log in (logging.getLogger("arviz"), logging.getLogger("arviz.preview"), getattr(arviz, "_log", None)):
            if log is not None:  # arviz._log is a Logger made outside logging's registry
                log.setLevel(logging.ERROR)
        yield


def add_field_summaries(idata, spectra: dict, k) -> None:
    """Add the ``field_summaries`` group: ``pk_white_noise`` and ``pk_linear``, each
    ``[chain, draw, k_bin]``, with the bins' centres ``k`` [h/Mpc] in its attrs, and, where the
    run recorded them, ``projections`` ``[chain, draw, projection]``: the field's data-constrained
    projections (fli.infer.sample.projections)."""
    groups = {name: spectra[name] for name in SPECTRA}
    coords, dims = {"k_bin": np.arange(len(k))}, {name: ["k_bin"] for name in SPECTRA}
    if spectra.get(PROJECTIONS) is not None and np.shape(spectra[PROJECTIONS])[-1] > 0:
        groups[PROJECTIONS] = spectra[PROJECTIONS]
        coords["projection"] = np.arange(np.shape(spectra[PROJECTIONS])[-1])
        dims[PROJECTIONS] = ["projection"]
    idata.add_groups({"field_summaries": groups}, coords=coords, dims=dims)
    idata.field_summaries.attrs["k"] = json.dumps(np.asarray(k).tolist())


def kappa_summary(obs) -> dict:
    """Per-bin mean, standard deviation and pixel count of the observed kappa (every process
    calls it: a sharded map is reduced where it lives, only scalars come back)."""
    k = obs.kappa_obs
    mask = None if obs.mask is None else np.asarray(obs.mask, bool)
    if isinstance(k, jax.Array) and not k.is_fully_addressable:
        mean = replicated_to_host(jax.jit(lambda x: jnp.mean(x, axis=(1, 2)))(k))
        std = replicated_to_host(jax.jit(lambda x: jnp.std(x, axis=(1, 2)))(k))
        n = np.full(mean.shape, k.shape[1] * k.shape[2])
    else:
        a = np.asarray(k, np.float64)
        m = np.ones(a.shape[1:], bool) if mask is None else mask
        mean, std = a[:, m].mean(1), a[:, m].std(1)
        n = np.full(mean.shape, int(m.sum()))
    return {"kappa_obs_mean": np.asarray(mean, np.float64), "kappa_obs_std": np.asarray(std, np.float64),
            "kappa_obs_pixels": n}


def _write(idata, run_dir: Path) -> Path:
    tmp = Path(run_dir) / (POSTERIOR_NC + ".tmp")
    idata.to_netcdf(str(tmp), engine="h5netcdf")
    os.replace(tmp, Path(run_dir) / POSTERIOR_NC)
    return Path(run_dir) / POSTERIOR_NC


def write_inference_data(run_dir: Path, names, obs_summary: dict, attrs: dict) -> Path | None:
    """``posterior.nc`` of one chain from its complete chunks (process 0; replaced atomically).

    ``names``: the sampled parameters; ``obs_summary``: the ``observed_data`` group
    (:func:`kappa_summary` and the noise); ``attrs``: the run's attributes (non-scalars as JSON).
    """
    if not is_writer():
        return None
    with quiet_arviz():
        import arviz as az  # noqa: PLC0415

        c = read_chunks(run_dir)
        if not c["draws"]:
            return None
        warm = c["draws"]["warmup"].astype(bool)
        keys = reported_names(names)

        def split(d, which, mask):
            return {k: np.asarray(d[k])[mask][None] for k in which if k in d}

        st = dict(c["stats"])
        st["lp"] = -st["potential_energy"]
        post_w = ~warm
        idata = az.from_dict(
            posterior=split(c["draws"], keys, post_w) if post_w.any() else None,
            sample_stats=split(st, STAT_KEYS, post_w) if post_w.any() else None,
            warmup_posterior=split(c["draws"], keys, warm) if warm.any() else None,
            warmup_sample_stats=split(st, STAT_KEYS, warm) if warm.any() else None,
            observed_data=obs_summary,
            save_warmup=bool(warm.any()),
            attrs={k: (json.dumps(v) if not isinstance(v, (str, int, float)) else v) for k, v in attrs.items()},
        )
        if post_w.any():
            spec = c["spectra"]
            add_field_summaries(idata, {name: spec[name][post_w][None] for name in (*SPECTRA, PROJECTIONS)
                                        if name in spec}, spec["k"])
        return _write(idata, run_dir)


def write_combined_inference_data(run_dir: Path, chain_dirs: list[Path]) -> Path | None:
    """``posterior.nc`` of a run of several chains: the chains' own files along ``chain``
    (process 0; replaced atomically)."""
    if not is_writer():
        return None
    with quiet_arviz():
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
        tmp = Path(run_dir) / (POSTERIOR_NC + ".tmp")
        idata.to_netcdf(str(tmp), engine="h5netcdf")
        for p in parts:
            p.close()
    os.replace(tmp, Path(run_dir) / POSTERIOR_NC)
    return Path(run_dir) / POSTERIOR_NC
