"""Checkpoints of resumable inference (``fli-map``, ``fli-nuts``): sharded pytrees with orbax.

Every function is called by every process of a ``jax.distributed`` run, on one shared ``ckpt_dir``:
:func:`save_checkpoint` ``(ckpt_dir, step, state, meta, keep=2) -> Path`` writes ``state`` (a
pytree of jax and numpy arrays, Python scalars, typed PRNG keys) and the JSON ``meta`` into
``ckpt_dir/<step>`` and keeps the newest ``keep`` complete checkpoints; :func:`latest_step` and
:func:`all_steps` name the complete ones (process 0's answer, broadcast); :func:`restore_checkpoint`
``(ckpt_dir, step | None, target) -> (state, meta)`` reads one back onto ``target``'s shardings,
which may be another device layout; :func:`read_meta` reads ``meta`` alone (e.g. the saved config,
for :func:`fli.infer.config_keys.check_resumable` before a target is built).

Format: ``ckpt_dir/<step>/`` holds orbax's ``commit_success.txt``, ``meta/metadata`` (JSON: format
version, step, ``meta``, one record per leaf) and ``state/`` (OCDBT, one ``ocdbt.process_<i>`` per
process). A checkpoint is complete when its directory is named by the step alone and holds both
files; ``<step>.orbax-checkpoint-tmp`` (a save in progress or killed) and ``<step>.fli-deleting``
(being pruned) never are. Leaves are stored flat in ``jax.tree_util`` order; their paths, shapes
and dtypes must match the target's, and values come back bitwise. Each leaf's checksum does not
depend on the layout: a restore refuses a damaged checkpoint with :class:`CheckpointError`, on every
process alike, so the caller can fall back. The full layout, PRNG keys and the multi-process
protocol: docs/nuts.md, "The checkpoint format".
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fli.store.files import barrier, jsonable
from fli.infer.checkpoint.leaves import (  # noqa: F401  (the errors and checksums are this module's API)
    CheckpointError,
    CheckpointMismatch,
    _empty,
    _finish,
    _first_path_difference,
    _is_key,
    _leaf_record,
    _restore_spec,
    checksums,
)
from fli.sim.sharding import get_logger

FORMAT_VERSION = 1
STATE_ITEM = "state"
META_ITEM = "meta"
META_FILE = "metadata"  # orbax JsonCheckpointHandler's default file name, inside META_ITEM
COMMIT_FILE = "commit_success.txt"  # orbax's commit marker (atomicity.COMMIT_SUCCESS_FILE)
TMP_MARK = ".orbax-checkpoint-tmp"  # orbax's temporary-directory suffix
DELETING = ".fli-deleting"

_STEP_NAME = re.compile(r"^\d+$")
_log = get_logger("fli.checkpoint")




# --------------------------------------------------------------------------- listing


def _is_complete(path: Path) -> bool:
    return (_STEP_NAME.match(path.name) is not None and path.is_dir()
            and (path / COMMIT_FILE).is_file() and (path / META_ITEM / META_FILE).is_file())


def _local_steps(ckpt_dir: Path) -> list[int]:
    if not ckpt_dir.is_dir():
        return []
    return sorted(int(p.name) for p in ckpt_dir.iterdir() if _is_complete(p))


def all_steps(ckpt_dir: str | Path) -> list[int]:
    """The steps of the complete checkpoints in ``ckpt_dir``, oldest first (as this process sees
    them); ``[]`` when there is none or no such directory."""
    return _local_steps(Path(ckpt_dir))


def latest_step(ckpt_dir: str | Path) -> int | None:
    """The newest complete checkpoint's step in ``ckpt_dir``, or None.

    Temporary (``*.orbax-checkpoint-tmp``) and uncommitted directories are ignored. With several
    processes, process 0 lists the directory and every process gets its answer (a collective:
    call it on every process).
    """
    steps = _local_steps(Path(ckpt_dir))
    if jax.process_count() == 1:
        return steps[-1] if steps else None
    from jax.experimental import multihost_utils  # noqa: PLC0415

    mine = np.int32(steps[-1] if steps else -1)
    step = int(multihost_utils.broadcast_one_to_all(mine))
    return None if step < 0 else step


def step_path(ckpt_dir: str | Path, step: int) -> Path:
    """``ckpt_dir/<step>``: where checkpoint ``step`` lives once complete."""
    return Path(ckpt_dir) / str(int(step))


# --------------------------------------------------------------------------- orbax plumbing


# Orbax logs ~40 absl INFO lines per save (on every process), which reach the root logger of
# an application logging at INFO; asyncio adds a DEBUG line per event loop orbax starts.
_QUIET = {"absl": logging.ERROR, "asyncio": logging.WARNING}


@contextlib.contextmanager
def _quiet_orbax() -> Iterator[None]:
    """Orbax's absl logging at ERROR and its Python warnings off, for the duration of a call."""
    loggers = {name: logging.getLogger(name) for name in _QUIET}
    levels = {name: lg.level for name, lg in loggers.items()}
    for name, lg in loggers.items():
        lg.setLevel(max(levels[name], _QUIET[name]))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"orbax\..*")
            warnings.filterwarnings("ignore", message=r".*[Oo]rbax.*")
            yield
    finally:
        for name, lg in loggers.items():
            lg.setLevel(levels[name])


def _checkpointer():
    import orbax.checkpoint as ocp  # noqa: PLC0415 - heavy import, only when checkpointing

    return ocp, ocp.Checkpointer(ocp.CompositeCheckpointHandler())


def _everywhere(ok: bool) -> bool:
    """Whether ``ok`` holds on every process (a collective with several)."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils  # noqa: PLC0415

    return bool(np.min(multihost_utils.process_allgather(np.array([int(ok)], np.int32))))


def _names(n: int) -> list[str]:
    return [f"{i:06d}" for i in range(n)]


# --------------------------------------------------------------------------- save


def save_checkpoint(ckpt_dir: str | Path, step: int, state: Any, meta: dict, keep: int = 2) -> Path:
    """Save ``state`` and ``meta`` as checkpoint ``step`` in ``ckpt_dir``; keep the newest ``keep``.

    Args:
        ckpt_dir: directory of the checkpoints (shared by all processes); created if missing.
        step: the step number (>= 0), the name of the checkpoint's directory. Saving a step that
            exists replaces it; checkpoints of later steps are deleted (a run resumed from an
            earlier step abandons them), so that afterwards ``latest_step(ckpt_dir) == step``.
        state: a pytree of jax Arrays (any sharding, e.g. fields ``P('x', 'y')`` or replicated
            scalars; typed PRNG keys too), numpy arrays and Python scalars. Each process writes
            the shards it holds; the save is synchronous (done when this returns).
        meta: JSON-able dict (the resolved config, pdims, wall time, ...); numpy values become
            lists, other objects their ``str``.
        keep: how many complete checkpoints to keep, this one included (>= 1); older ones are
            deleted after this one is committed.
    Returns:
        ``ckpt_dir/<step>``.
    """
    step, keep = _check_int("step", step, 0), _check_int("keep", keep, 1)
    ckpt_dir = Path(ckpt_dir).absolute()  # orbax takes absolute paths only; run_dir= may be relative
    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    records, values = [], {}
    sums = checksums([leaf for _, leaf in flat])
    for name, (kp, leaf), checksum in zip(_names(len(flat)), flat, sums, strict=True):
        path = jax.tree_util.keystr(kp)
        rec, value = _leaf_record(path, leaf)
        records.append({"path": path} | rec | {"checksum": checksum})
        if np.size(value):  # orbax refuses a zero-size array (theta at fixed cosmology): its record is all of it
            values[name] = value
    sidecar = {"fli_checkpoint": FORMAT_VERSION, "step": step, "process_count": jax.process_count(),
               "meta": jsonable(dict(meta)), "leaves": records}
    final = step_path(ckpt_dir, step)

    if jax.process_index() == 0:
        _remove_stale(ckpt_dir)
    barrier("fli-ckpt-clean")
    with _quiet_orbax():
        ocp, ckptr = _checkpointer()
        items = {META_ITEM: ocp.args.JsonSave(sidecar)}
        if values:  # orbax refuses an empty item
            items[STATE_ITEM] = ocp.args.StandardSave(values)
        with ckptr:
            ckptr.save(final, args=ocp.args.Composite(**items), force=True)
    if jax.process_index() == 0:
        _prune(ckpt_dir, step, keep)
        _log.info("checkpoint %d saved in %s (%d leaves)", step, final, len(records))
    barrier("fli-ckpt-saved")
    return final


def _check_int(key: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{key} must be an integer >= {low}, got {value!r}")
    return int(value)


def _remove_stale(ckpt_dir: Path) -> None:
    """Remove what killed saves and prunes left behind (process 0, before a save)."""
    if not ckpt_dir.is_dir():
        return
    for p in ckpt_dir.iterdir():
        if TMP_MARK in p.name or p.name.endswith(DELETING):
            _log.info("removing %s left by an interrupted save or prune", p)
            shutil.rmtree(p, ignore_errors=True)


def _prune(ckpt_dir: Path, step: int, keep: int) -> None:
    """Delete the steps after ``step`` and all but the newest ``keep`` up to it."""
    steps = _local_steps(ckpt_dir)
    older = [s for s in steps if s <= step]
    for old in [s for s in steps if s > step] + older[:-keep]:
        src = step_path(ckpt_dir, old)
        trash = src.with_name(src.name + DELETING)
        src.rename(trash)  # atomic: a step is either complete or gone
        shutil.rmtree(trash, ignore_errors=True)


# --------------------------------------------------------------------------- restore


def read_meta(ckpt_dir: str | Path, step: int | None = None) -> dict:
    """The ``meta`` dict saved with checkpoint ``step`` (None: the latest); no arrays are read.

    Raises:
        CheckpointError: no such complete checkpoint, or its JSON is unreadable.
    """
    return _read_sidecar(_resolve(ckpt_dir, step)[0])["meta"]


def newest_readable(ckpt_dir: str | Path, log: logging.Logger, below: int | None = None
                    ) -> tuple[int | None, dict | None]:
    """The newest complete checkpoint (older than ``below``, if given) whose meta reads, with
    its meta; each unreadable one is reported in one line and skipped. ``(None, None)`` when
    there is none at all.

    Raises:
        CheckpointError: checkpoints exist but none is readable.
    """
    latest = latest_step(ckpt_dir)
    if latest is None:
        return None, None
    steps = sorted({latest, *(s for s in all_steps(ckpt_dir) if s <= latest)}, reverse=True)
    steps = [s for s in steps if below is None or s < below]
    first_error = None
    for s in steps:
        try:
            return s, read_meta(ckpt_dir, s)
        except CheckpointError as e:
            first_error = first_error or e
            log.warning("%s: falling back to an earlier checkpoint", e)
    if first_error is not None:
        raise CheckpointError(f"no intact checkpoint in {ckpt_dir} ({first_error}): use a new run_dir")
    return None, None


def restore_with_fallback(ckpt_dir: str | Path, step: int, meta: dict, restore: Callable, log: logging.Logger):
    """``restore(step, meta)``, or where that checkpoint is damaged (:class:`CheckpointError`)
    the same of the newest intact checkpoint before it, saying so; returns
    ``(restore's result, step, meta)`` of the one used."""
    while True:
        try:
            return restore(step, meta), step, meta
        except CheckpointError as e:
            prev, prev_meta = newest_readable(ckpt_dir, log, below=step)
            if prev is None:
                raise CheckpointError(f"{e}; no earlier checkpoint to fall back to: use a new run_dir") from None
            log.warning("%s: falling back to checkpoint %d", e, prev)
            step, meta = prev, prev_meta


def read_leaves(ckpt_dir: str | Path, step: int | None = None) -> list[dict]:
    """The saved leaves' records of checkpoint ``step`` (None: the latest complete one): each
    ``{"path", "kind", "shape", "dtype", ...}``, in tree order."""
    path, _ = _resolve(ckpt_dir, step)
    return _read_sidecar(path)["leaves"]


def _resolve(ckpt_dir: str | Path, step: int | None) -> tuple[Path, int]:
    ckpt_dir = Path(ckpt_dir).absolute()  # as save_checkpoint: orbax takes absolute paths only
    if step is None:
        step = latest_step(ckpt_dir)
        if step is None:
            raise CheckpointError(f"no complete checkpoint in {ckpt_dir}: nothing to resume from")
    path = step_path(ckpt_dir, step)
    if not _is_complete(path):
        tmp = path.with_name(path.name + TMP_MARK)
        state = ("incomplete (no commit marker: its save was interrupted)" if path.is_dir() else
                 f"incomplete (its save was interrupted and left {tmp.name})" if tmp.exists() else "missing")
        raise CheckpointError(f"checkpoint {path} is {state}; complete steps in {ckpt_dir}: "
                              f"{_local_steps(ckpt_dir)}")
    return path, int(step)


def _read_sidecar(path: Path) -> dict:
    file = path / META_ITEM / META_FILE
    try:
        sidecar = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt: {file.name} unreadable "
                              f"({type(e).__name__}: {_one_line(e)})") from None
    if not isinstance(sidecar, dict) or sidecar.get("fli_checkpoint") != FORMAT_VERSION:
        got = sidecar.get("fli_checkpoint") if isinstance(sidecar, dict) else None
        raise CheckpointError(f"checkpoint {path} has format {got!r}, expected {FORMAT_VERSION}")
    return sidecar


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""


def restore_checkpoint(ckpt_dir: str | Path, step: int | None, target: Any) -> tuple[Any, dict]:
    """Read checkpoint ``step`` (None: the latest complete one) onto the layout of ``target``.

    Args:
        ckpt_dir: directory given to :func:`save_checkpoint`.
        step: the step to read; None for :func:`latest_step`.
        target: a pytree of the saved structure whose leaves give each leaf's wanted form:
            a jax Array (its sharding is used), a ``jax.ShapeDtypeStruct`` with a ``sharding``
            (without one: an array on the default device), a numpy array (read as numpy) or a
            Python scalar (read as that type). The sharding may be another mesh than the one
            saved, e.g. saved on pdims (2, 4), read on (1, 1); each process reads its blocks.
    Returns:
        ``(state, meta)``: ``state`` with the target's tree structure, values bitwise as saved
        (weak types are not kept: restored arrays are strongly typed), and the saved ``meta``.
    Raises:
        CheckpointError: the checkpoint is missing, incomplete or unreadable.
        CheckpointMismatch: its tree paths, shapes, dtypes or key kinds differ from ``target``.
    """
    path, step = _resolve(ckpt_dir, step)
    sidecar = _read_sidecar(path)
    records = sidecar["leaves"]
    flat, treedef = jax.tree_util.tree_flatten_with_path(target)
    if len(flat) != len(records):
        raise CheckpointMismatch(f"checkpoint {path} holds {len(records)} leaves, the target has "
                                 f"{len(flat)}: {_first_path_difference(records, flat)}")
    wanted, names = {}, _names(len(flat))
    for name, rec, (kp, leaf) in zip(names, records, flat):
        spec = _restore_spec(path, rec, jax.tree_util.keystr(kp), leaf)
        if math.prod(rec["shape"]):
            wanted[name] = spec
    got, why = {}, None
    try:
        with _quiet_orbax():
            ocp, ckptr = _checkpointer()
            with ckptr:
                if wanted:
                    got = ckptr.restore(path, args=ocp.args.Composite(
                        **{STATE_ITEM: ocp.args.StandardRestore(wanted)}))[STATE_ITEM]
    except Exception as e:  # noqa: BLE001  orbax and TensorStore raise many kinds for a damaged file
        why = f"unreadable ({type(e).__name__}: {_one_line(e)})"
    leaves = []
    if why is None:
        leaves = [_finish(rec, got[name] if name in got else _empty(rec, leaf), leaf)
                  for name, rec, (_, leaf) in zip(names, records, flat)]
        sums = checksums(leaves)
        bad = [rec["path"] for rec, s in zip(records, sums, strict=True) if rec.get("checksum", s) != s]
        if bad:
            why = (f"damaged: {len(bad)} leaf(s) differ from the checksums taken when it was saved (first "
                   f"{bad[0] or '<root>'})")
    if not _everywhere(why is None):  # every process takes the same decision
        raise CheckpointError(f"checkpoint {path} is {why or 'unreadable on another process'}")
    _log.info("checkpoint %d restored from %s", step, path)
    return jax.tree_util.tree_unflatten(treedef, leaves), sidecar["meta"]
