"""Content fingerprints of zarr groups: a missing, damaged or swapped file is never read as data.

A zarr store reads a missing chunk file as its fill value (zeros), and a ``COMPLETE`` marker
proves that a write finished, not that the data are still there. So every group fli writes
(:func:`fli.store.io.write_arrays`) records, once its arrays are written:

* on each array, attribute :data:`CHUNKS_ATTR`: the SHA-256 of every chunk's values (its bytes
  in C order, with the dtype and shape), keyed by the chunk's grid index ``"i.j.k"``;
* on the group, attribute :data:`GROUP_ATTR`: the SHA-256 over every array's name, shape,
  dtype and chunk hashes and over the group's attributes except ``config`` (the record of
  what made it, with paths that differ between two copies of the same data). Two groups
  with the same fingerprint hold the same numbers, wherever they are and however their path
  is spelled.

Reading (:func:`read_verified`) reads the chunks a block overlaps, hashes each and compares:
each process checks only the blocks it reads, at the cost of one hash of data it reads
anyway. A group written before fingerprints existed has none; it is read unchecked and its
fingerprint is None.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

CHUNKS_ATTR = "fli_chunk_sha256"
GROUP_ATTR = "fli_fingerprint"
ARRAYS_ATTR = "fli_array_sha256"  # on the group: each array's own hash, to name what changed
# group attributes that record provenance, not data: left out of the group's fingerprint
PROVENANCE = ("config", GROUP_ATTR, ARRAYS_ATTR)


class DamagedData(FileNotFoundError):
    """Stored data do not match the fingerprint recorded when they were written (a chunk file
    missing, truncated or replaced). A ``FileNotFoundError``, so that every fli command reports
    it in one line with exit status 2."""


def block_hash(a: np.ndarray) -> str:
    """SHA-256 of an array's values, dtype and shape."""
    a = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{a.dtype.str}{list(a.shape)}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def chunk_grid(shape, chunks) -> Iterator[tuple[str, tuple[slice, ...]]]:
    """``(key, slices)`` of every chunk of an array of ``shape`` cut in ``chunks``; a zero-size
    axis (chunked 0 where its chunks are its shape: a theta of no sampled parameter) is one empty chunk."""
    chunks = [max(1, int(c)) for c in chunks]
    counts = [max(1, -(-int(n) // c)) for n, c in zip(shape, chunks, strict=True)]
    for idx in itertools.product(*(range(n) for n in counts)):
        sl = tuple(slice(i * int(c), min((i + 1) * int(c), int(n))) for i, c, n in zip(idx, chunks, shape,
                                                                                       strict=True))
        yield ".".join(map(str, idx)) or "0", sl


def _hashes_of(zarr_array) -> dict[str, str]:
    return {key: block_hash(np.asarray(zarr_array[sl])) for key, sl in chunk_grid(zarr_array.shape,
                                                                                 zarr_array.chunks)}


def array_fingerprint(z) -> str | None:
    """An array's hash from its shape, dtype and recorded chunk hashes (None without them)."""
    hashes = dict(z.attrs).get(CHUNKS_ATTR)
    if not isinstance(hashes, Mapping):
        return None
    return hashlib.sha256(json.dumps([list(z.shape), str(np.dtype(z.dtype)), sorted(hashes.items())]).encode()
                          ).hexdigest()


def group_fingerprint(arrays: Mapping[str, Any], attrs: Mapping[str, Any]) -> str | None:
    """The group's fingerprint from its arrays' recorded chunk hashes and its attributes;
    None when an array has no recorded hashes (written before fingerprints)."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        fp = array_fingerprint(arrays[name])
        if fp is None:
            return None
        h.update(json.dumps([name, fp]).encode())
    data_attrs = {k: v for k, v in attrs.items() if k not in PROVENANCE}
    h.update(json.dumps(data_attrs, sort_keys=True, default=str).encode())
    return h.hexdigest()


def record(root) -> str:
    """Hash every chunk of every array of the zarr group ``root`` (open for writing), store
    the hashes and the group's fingerprint as attributes; returns the fingerprint. Reads the
    arrays back, so it also proves that what was written can be read."""
    arrays = {name: root[name] for name in root.array_keys()}
    for z in arrays.values():
        z.attrs.update({CHUNKS_ATTR: _hashes_of(z)})
    fp = group_fingerprint(arrays, dict(root.attrs))
    root.attrs.update({GROUP_ATTR: fp, ARRAYS_ATTR: {n: array_fingerprint(z) for n, z in arrays.items()}})
    return fp


def recorded_fingerprint(path) -> str | None:
    """The fingerprint recorded on the zarr group at ``path`` (no data read), or None."""
    import zarr  # noqa: PLC0415

    return dict(zarr.open_group(str(path), mode="r").attrs).get(GROUP_ATTR)


def chunk_hashes(block: np.ndarray, index: tuple, shape, chunks) -> dict[str, str]:
    """The hashes of the chunks that lie wholly inside ``block``, the region ``index`` (slices;
    empty: the whole array) of an array of ``shape`` cut in ``chunks``."""
    index = tuple(index) + tuple(slice(None) for _ in range(len(shape) - len(tuple(index))))
    region = [s.indices(int(n))[:2] for s, n in zip(index, shape, strict=True)]
    out = {}
    for key, sl in chunk_grid(shape, chunks):
        if all(lo <= s.start and s.stop <= hi for s, (lo, hi) in zip(sl, region, strict=True)):
            sub = tuple(slice(s.start - lo, s.stop - lo) for s, (lo, _) in zip(sl, region, strict=True))
            out[key] = block_hash(block[sub])
    return out


def record_hashes(path, hashes: dict[str, dict[str, str]], barrier) -> str | None:
    """Record a group's fingerprint from the chunk hashes each process took of what it wrote
    (``{array: {chunk key: hash}}``; a collective, ``barrier`` the run's). Process 0 gathers
    them (through small files beside the arrays with several processes), hashes by reading
    back any chunk nobody hashed, and writes the attributes; returns the fingerprint there."""
    import jax  # noqa: PLC0415
    import zarr  # noqa: PLC0415

    tmp = Path(path) / ".fli-hashes"
    if jax.process_count() > 1:
        tmp.mkdir(exist_ok=True)
        (tmp / f"{jax.process_index()}.json").write_text(json.dumps(hashes))
    barrier("fli-io-written")
    fp = None
    if jax.process_index() == 0:
        merged = {name: {} for name in hashes}
        parts = sorted(tmp.glob("*.json")) if tmp.is_dir() else []
        for part in [json.loads(p.read_text()) for p in parts] or [hashes]:
            for name, h in part.items():
                merged.setdefault(name, {}).update(h)
        if tmp.is_dir():
            for p in parts:
                p.unlink()
            tmp.rmdir()
        root = zarr.open_group(str(path), mode="r+")
        arrays = {name: root[name] for name in root.array_keys()}
        for name, z in arrays.items():
            h = merged.get(name, {})
            for key, sl in chunk_grid(z.shape, z.chunks):
                if key not in h:  # a chunk no process held whole: read it back
                    h[key] = block_hash(np.asarray(z[sl]))
            z.attrs.update({CHUNKS_ATTR: h})
        fp = group_fingerprint(arrays, dict(root.attrs))
        root.attrs.update({GROUP_ATTR: fp, ARRAYS_ATTR: {n: array_fingerprint(z) for n, z in arrays.items()}})
    barrier("fli-io-fingerprinted")
    return fp


def check_group(arrays: Mapping[str, Any], attrs: Mapping[str, Any], where: str) -> str | None:
    """A group's recorded fingerprint, after checking it against its arrays' (``{name: zarr
    array}``) recorded chunk hashes and its attributes (no data read); None for a group
    without one."""
    saved = attrs.get(GROUP_ATTR)
    if saved is None:
        return None
    now = group_fingerprint(arrays, attrs)
    if now != saved:
        was = attrs.get(ARRAYS_ATTR) or {}
        missing = sorted(set(was) - set(arrays))
        added = sorted(set(arrays) - set(was))
        changed = sorted(n for n in set(was) & set(arrays) if was[n] != array_fingerprint(arrays[n]))
        what = ("; ".join(f"{label} {names}" for label, names in (("array(s) missing:", missing),
                                                                 ("array(s) added:", added),
                                                                 ("array(s) replaced:", changed)) if names)
                or "its attributes changed")
        raise DamagedData(f"{where}: it no longer matches the fingerprint recorded when it was written "
                          f"({short(saved)}; now {short(now)}): {what}; write it again")
    return saved


def read_verified(zarr_array, idx: tuple[slice, ...] | None = None, where: str = "") -> np.ndarray:
    """Block ``idx`` (default: all) of a zarr array as numpy, every chunk it overlaps checked
    against the array's recorded hashes (unchecked where it has none).

    Raises:
        DamagedData: a chunk's values differ from what was written (a missing chunk file reads
            as the fill value, so it is caught here), naming the array and the chunk.
    """
    shape = tuple(int(s) for s in zarr_array.shape)
    idx = tuple(slice(None) for _ in shape) if idx is None else tuple(idx)
    idx = tuple(s if isinstance(s, slice) else slice(int(s), int(s) + 1) for s in idx)
    idx = idx + tuple(slice(None) for _ in range(len(shape) - len(idx)))
    want = [range(*s.indices(n)) for s, n in zip(idx, shape, strict=True)]
    hashes = dict(zarr_array.attrs).get(CHUNKS_ATTR)
    if not isinstance(hashes, Mapping):
        return np.asarray(zarr_array[idx])
    out = np.empty([len(r) for r in want], dtype=np.dtype(zarr_array.dtype))
    chunks = tuple(int(c) for c in zarr_array.chunks)
    for key, sl in chunk_grid(shape, chunks):
        lo = [max(s.start, r.start) if len(r) else 0 for s, r in zip(sl, want, strict=True)]
        hi = [min(s.stop, r.stop) if len(r) else 0 for s, r in zip(sl, want, strict=True)]
        if any(a >= b for a, b in zip(lo, hi, strict=True)):
            continue
        try:
            block = np.asarray(zarr_array[sl])
        except Exception as e:  # noqa: BLE001  a truncated or garbled chunk fails to decode
            raise DamagedData(f"{where or zarr_array.name}: chunk {key} is unreadable ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:200] if str(e) else ''}): the data are damaged; write them "
                              f"again") from None
        if block_hash(block) != hashes.get(key):
            raise DamagedData(f"{where or zarr_array.name}: chunk {key} does not match the fingerprint recorded when "
                              f"it was written (a chunk file missing, truncated or replaced): the data are damaged; "
                              f"write them again")
        src = tuple(slice(a - s.start, b - s.start) for a, b, s in zip(lo, hi, sl, strict=True))
        dst = tuple(slice(a - r.start, b - r.start) for a, b, r in zip(lo, hi, want, strict=True))
        out[dst] = block[src]
    return out


def short(fp: str | None) -> str:
    """A fingerprint as shown in messages: its first 16 hex digits."""
    return "none" if fp is None else fp[:16]
