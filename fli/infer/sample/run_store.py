"""A sampling run's directory: the one owner of its format, for the sampler and fli-diagnose.

Run directory (each file's contents: docs/nuts.md, "Chunks, outputs, resume")::

    config.yaml            the resolved config
    checkpoints/<chunk>/   orbax (fli.infer.checkpoint.store): kernel state, running statistics
    chunks/chunk_00003/    one per complete chunk: draws.npz, stats.npz, spectra.npz, fields.zarr
    running.zarr           Welford mean and variance of the white noise and the noiseless kappa
    posterior.nc           ArviZ InferenceData of the complete chunks (fli.infer.sample.inference_data)
    nuts.json              written last: what ran, how long, draws, divergences

Several vectorised chains (``inference.chains_per_run``) give one ``chain_<c>/`` per chain (its
chunks, ``running.zarr``, ``posterior.nc``) beside the shared checkpoints and a ``posterior.nc``
of all the chains (docs/nuts.md, "Many chains").

A chunk is complete when ``chunks/chunk_<i>`` exists. Per chunk: write it aside
(``chunks/.chunk_<i>.tmp``, each file renamed into place, a ``DONE`` file last), save checkpoint
``<i>``, then rename the chunk into place. A resume restores the last complete checkpoint, renames
a chunk whose rename was cut off and removes anything later (:func:`tidy_chunks`), so no chunk is
lost or written twice; a reader sees complete chunks only, so a running chain can be read any time.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import yaml

from fli.store.files import barrier, is_writer, replace_dir, savez, write_text
from fli.store.fingerprint import read_verified
from fli.sim.sharding import replicated_to_host

CONFIG_YAML = "config.yaml"
CHECKPOINTS = "checkpoints"
CHUNKS = "chunks"
RUNNING = "running.zarr"
POSTERIOR_NC = "posterior.nc"
NUTS_JSON = "nuts.json"
FIELDS = "fields.zarr"
DONE = "DONE"
CHAIN_PREFIX = "chain_"


# ---------------------------------------------------------------- where things are


def chain_dir(run_dir: Path, c: int, chains: int) -> Path:
    """Where chain ``c`` of a run writes its chunks: the run directory itself for one chain,
    ``chain_<c>/`` in it for ``inference.chains_per_run`` > 1."""
    return Path(run_dir) if chains == 1 else Path(run_dir) / f"{CHAIN_PREFIX}{c}"


def chains_of(run: Path) -> list[Path]:
    """The chain directories of a run: its ``chain_<c>/`` for a run of several vectorised
    chains, else the run itself."""
    subs = [p for p in Path(run).glob(f"{CHAIN_PREFIX}*") if p.is_dir() and p.name[len(CHAIN_PREFIX):].isdigit()]
    return sorted(subs, key=lambda p: int(p.name[len(CHAIN_PREFIX):])) or [Path(run)]


def is_sampling_run(path: Path) -> bool:
    """Whether ``path`` looks like a sampling run (its chunks or its config are there)."""
    return (Path(path) / CHUNKS).is_dir() or (Path(path) / CONFIG_YAML).is_file()


def chunk_dir(run_dir: Path, i: int) -> Path:
    return Path(run_dir) / CHUNKS / f"chunk_{i:05d}"


def _tmp_chunk_dir(run_dir: Path, i: int) -> Path:
    return Path(run_dir) / CHUNKS / f".chunk_{i:05d}.tmp"


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


def chunks_being_written(run_dir: Path) -> list[str]:
    """Names of the chunks written aside, not yet complete."""
    d = Path(run_dir) / CHUNKS
    return sorted(p.name for p in d.glob(".chunk_*.tmp")) if d.is_dir() else []


def read_config(run_dir: Path) -> dict | None:
    """The resolved config a run recorded, or None where it has none."""
    f = Path(run_dir) / CONFIG_YAML
    if not f.is_file():
        return None
    return yaml.load(f.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}


def write_config(run_dir: Path, resolved: dict) -> None:
    """``config.yaml`` of a run (process 0; the directory is made)."""
    if is_writer():
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        write_text(Path(run_dir) / CONFIG_YAML, yaml.safe_dump(resolved, sort_keys=False))


# ---------------------------------------------------------------- chunks


def tidy_chunks(run_dir: Path, last: int | None, log: logging.Logger) -> None:
    """Make the chunks agree with checkpoint ``last`` (process 0): finish a rename cut off
    after the checkpoint, remove everything later and every other temporary."""
    if is_writer():
        d = Path(run_dir) / CHUNKS
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
    barrier("fli-nuts-tidy")


def write_chunk(run_dir: Path, i: int, first_draw: int, num_warmup: int, draws, fields, thin: int, k,
                seconds: np.ndarray, grid_info: dict) -> Path:
    """Write chunk ``i`` aside (every process: the fields are written per block).

    ``draws``: one chain's :class:`fli.infer.sample.chunk.Draws` ``[n]`` (replicated); ``fields``:
    ``(white noise, kappa)`` of the thinned draws or None; ``k``: the spectra's bin centres.
    """
    from fli.store.io import write_arrays  # noqa: PLC0415

    host = replicated_to_host
    tmp = _tmp_chunk_dir(run_dir, i)
    if is_writer():
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    barrier("fli-nuts-chunk-dir")
    n = int(np.shape(host(draws.grads))[0])
    idx = np.arange(first_draw, first_draw + n)
    params = {k2: host(v) for k2, v in draws.params.items()}
    savez(tmp / "draws.npz", draw=idx, warmup=idx < num_warmup, **params)
    info = draws.info
    stats = {"diverging": host(info.diverging), "energy": host(info.energy),
             "potential_energy": host(info.potential_energy), "tree_depth": host(info.tree_depth),
             "n_steps": host(info.num_steps), "step_size": host(info.step_size),
             "acceptance_rate": host(info.accept_prob), "mean_accept_prob": host(info.mean_accept_prob),
             "energy_error": host(info.energy_error), "turning": host(info.turning),
             "gradient_evals": host(draws.grads), "max_disp": host(draws.max_disp), "seconds": seconds}
    savez(tmp / "stats.npz", draw=idx, **stats)
    proj = host(draws.proj)
    savez(tmp / "spectra.npz", draw=idx, k=np.asarray(k), pk_white_noise=host(draws.pk_s), pk_linear=host(draws.pk_lin),
          **({"projections": proj} if np.shape(proj)[-1] > 0 else {}))
    if fields is not None:
        kept = idx[thin - 1::thin][: fields[0].shape[0]]
        write_arrays(tmp / FIELDS, {"white_noise": fields[0], "kappa": fields[1]},
                     {"draw": kept.tolist(), "warmup": (kept < num_warmup).tolist(), **grid_info})
    barrier("fli-nuts-chunk-written")
    write_text(tmp / DONE, json.dumps({"chunk": i, "draws": [int(idx[0]), int(idx[-1])]}))
    barrier("fli-nuts-chunk-done")
    return tmp


def mark_chunk(run_dir: Path, i: int) -> None:
    """Rename chunk ``i`` into place: from now on it is complete."""
    if is_writer():
        _tmp_chunk_dir(run_dir, i).rename(chunk_dir(run_dir, i))
    barrier("fli-nuts-chunk-marked")


def read_chunks(run_dir: Path, which=None) -> dict:
    """The draws, stats and spectra of the complete chunks (or of ``which``), concatenated
    (numpy): ``{"draws": {...}, "stats": {...}, "spectra": {...}}``. A float statistic that
    some chunks lack (a run extended across a version that added it, e.g. ``turning``) is NaN
    in those chunks' draws, so that every array stays aligned with the draws."""
    run_dir = Path(run_dir)
    out: dict = {"draws": {}, "stats": {}, "spectra": {}}
    lengths: list = []
    for i in (complete_chunks(run_dir) if which is None else which):
        for part in out:
            with np.load(chunk_dir(run_dir, i) / f"{part}.npz") as f:
                if part == "draws":
                    lengths.append(len(f["draw"]))
                for name in f.files:
                    out[part].setdefault(name, {})[len(lengths) - 1] = f[name]
    for d in out.values():
        for name, by_chunk in d.items():
            if name == "k":
                d[name] = next(iter(by_chunk.values()))
                continue
            pieces = [by_chunk.get(j) for j in range(len(lengths))]
            if any(p is None for p in pieces):
                like = next(p for p in pieces if p is not None)
                if not np.issubdtype(like.dtype, np.floating):
                    raise ValueError(f"{run_dir}: {name!r} is missing from some chunks and is not a float statistic")
                pieces = [np.full((n, *like.shape[1:]), np.nan, like.dtype) if p is None else p
                          for p, n in zip(pieces, lengths, strict=True)]
            d[name] = np.concatenate(pieces)
    return out


def count_post_divergences(run_dir: Path) -> int:
    """Divergences after warm-up in the complete chunks."""
    c = read_chunks(run_dir) if complete_chunks(run_dir) else None
    if not c:
        return 0
    return int(np.sum(c["stats"]["diverging"][~c["draws"]["warmup"].astype(bool)]))


def read_thinned_kappa(runs: list[Path], chunks: list[list[int]], n: int) -> list[tuple[Path, int, np.ndarray]]:
    """Up to ``n`` post-warm-up kappa draws from the chunks' ``fields.zarr``, the latest of
    each run first: ``[(run, draw, kappa)]``."""
    import zarr  # noqa: PLC0415

    found = []
    for run, done in zip(runs, chunks, strict=True):
        for i in reversed(done):
            p = chunk_dir(run, i) / FIELDS
            if not p.is_dir():
                continue
            g = zarr.open_group(str(p), mode="r")
            draws, warm = g.attrs.get("draw", []), g.attrs.get("warmup", [])
            for j in range(len(draws) - 1, -1, -1):
                if not warm[j]:
                    kappa = read_verified(g["kappa"], (slice(j, j + 1),), f"{p}/kappa")[0]
                    found.append((run, int(draws[j]), np.asarray(kappa, np.float64)))
                    break
            if len(found) >= n or (found and found[-1][0] == run):
                break
        if len(found) >= n:
            break
    return found[:n]


# ---------------------------------------------------------------- running statistics


def write_running(run_dir: Path, acc, grid_info: dict) -> None:
    """``running.zarr``: the Welford mean and variance of one chain's
    :class:`fli.infer.sample.chunk.Accum`, replaced atomically."""
    from fli.store.io import write_arrays  # noqa: PLC0415

    n = int(replicated_to_host(acc.n))
    denom = max(n - 1, 1)
    tmp = Path(run_dir) / (RUNNING + ".tmp")
    write_arrays(tmp, {"mean_white_noise": acc.mean_s, "var_white_noise": acc.m2_s / denom,
                       "mean_kappa": acc.mean_kappa, "var_kappa": acc.m2_kappa / denom},
                 {"n_draws": n, **grid_info})
    replace_dir(tmp, Path(run_dir) / RUNNING)
    barrier("fli-nuts-running")


def pooled_running(runs: list[Path], notes: list[str]) -> dict | None:
    """Mean and variance of the white noise and kappa over the runs' ``running.zarr``, pooled
    by their draw counts (``{"n", "mean_white_noise", "var_white_noise", "mean_kappa",
    "var_kappa"}``); None when none holds a draw. What is missing is said in ``notes``."""
    import zarr  # noqa: PLC0415

    parts = []
    for run in runs:
        p = Path(run) / RUNNING
        if not p.is_dir():
            notes.append(f"{run}: no {RUNNING}")
            continue
        g = zarr.open_group(str(p), mode="r")
        n = int(g.attrs.get("n_draws", 0))
        if n:
            parts.append((n, {k: np.asarray(read_verified(g[k], None, f"{p}/{k}"), np.float64)
                              for k in ("mean_white_noise", "var_white_noise", "mean_kappa", "var_kappa")}))
    if not parts:
        return None
    ntot = sum(n for n, _ in parts)
    out = {"n": ntot}
    for f in ("white_noise", "kappa"):
        mean = sum(n * a[f"mean_{f}"] for n, a in parts) / ntot
        # the law of total variance over the chains (each chain's variance has ddof 1)
        ss = sum((n - 1) * a[f"var_{f}"] + n * (a[f"mean_{f}"] - mean) ** 2 for n, a in parts)
        out[f"mean_{f}"], out[f"var_{f}"] = mean, ss / max(ntot - 1, 1)
    return out
