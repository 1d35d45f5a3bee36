"""Writing a run's files so that nothing half-written looks complete, on one process or many.

Every fli command writes its small files from process 0 and its sharded arrays from every
process (:func:`fli.store.io.write_arrays`). The rules, kept here once:

* a file is written aside (``<name>.tmp``) and renamed into place, so a reader sees the old
  file or the new one, never a part (:func:`write_text`, :func:`savez`);
* a directory is replaced by renaming the new one into place and removing the old one after
  (:func:`replace_dir`);
* processes meet at a named :func:`barrier` wherever one writes what another reads next (a
  no-op on one process).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jax
import numpy as np

BARRIER_TIMEOUT = 3600  # [s] the longest one process waits at a barrier for the others (compiling, writing)


def barrier(name: str) -> None:
    """Wait until every process of a ``jax.distributed`` run reaches ``name``.

    The wait goes through jax's coordination service (its ``wait_at_barrier``, up to
    :data:`BARRIER_TIMEOUT`), not through a device collective: on CPU a collective runs over
    gloo, which gives up when its peer arrives more than 30 s later ("Gloo context
    initialization failed: ... GetKeyValue() timed out", measured: two processes, one 45 s
    late). A peer still compiling its program, or process 0 writing a chunk, is that late on a
    loaded machine, so call this before a compiled program's first collective. A dead peer
    still stops the wait within the heartbeat timeout (``fli.sim.sharding.init_distributed``)."""
    if jax.process_count() > 1:
        client = _coordination_client()
        if client is None:
            from jax.experimental import multihost_utils  # noqa: PLC0415

            multihost_utils.sync_global_devices(name)
        else:
            client.wait_at_barrier(name, BARRIER_TIMEOUT * 1000)


def _coordination_client():
    """jax.distributed's client of the coordination service (private in jax 0.10), or None."""
    try:
        from jax._src import distributed  # noqa: PLC0415
    except ImportError:
        return None
    client = getattr(distributed.global_state, "client", None)
    return client if hasattr(client, "wait_at_barrier") else None


def agree(values: list) -> list:
    """Process 0's ``values`` (JSON-able) on every process; the values themselves for one process."""
    if jax.process_count() == 1:
        return values
    from jax.experimental import multihost_utils  # noqa: PLC0415

    raw = json.dumps(values).encode()
    size = 1 << 16
    if len(raw) > size - 4:
        from fli.config import ConfigError  # noqa: PLC0415

        raise ConfigError(f"run directories too long to share between processes ({len(raw)} bytes)")
    buf = np.zeros(size, np.uint8)  # uint8: no int64 without jax_enable_x64
    buf[:4] = np.frombuffer(len(raw).to_bytes(4, "little"), np.uint8)
    buf[4:4 + len(raw)] = np.frombuffer(raw, np.uint8)
    buf = np.asarray(multihost_utils.broadcast_one_to_all(buf), np.uint8)
    n = int.from_bytes(buf[:4].tobytes(), "little")
    return json.loads(buf[4:4 + n].tobytes().decode())


def is_writer() -> bool:
    """Whether this process writes the run's small files (process 0)."""
    return jax.process_index() == 0


def write_text(path: Path, text: str) -> None:
    """``text`` into ``path``, written aside and renamed (process 0 only)."""
    if is_writer():
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def write_json(path: Path, obj, **kw) -> None:
    """``obj`` as indented JSON into ``path`` (:func:`write_text`)."""
    write_text(path, json.dumps(obj, indent=1, **kw))


def savez(path: Path, **arrays) -> None:
    """``np.savez`` into ``path``, written aside and renamed (process 0 only)."""
    if is_writer():
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, path)


def replace_dir(new: Path, final: Path) -> None:
    """Put directory ``new`` in the place of ``final`` (process 0): the old one is renamed
    aside first and removed once the new one is in place."""
    if is_writer():
        new, final = Path(new), Path(final)
        old = final.with_name(final.name + ".old")
        if final.exists():
            final.rename(old)
        new.rename(final)
        if old.exists():
            shutil.rmtree(old)


def jsonable(obj):
    """``obj`` as plain JSON types (arrays to lists, anything else unknown to its str)."""
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
