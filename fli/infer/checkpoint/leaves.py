"""How a checkpoint stores each leaf of a state, and rebuilds it onto a target leaf.

:mod:`fli.infer.checkpoint.store` saves and restores whole states with orbax; here is what it does
per leaf: the JSON record of a leaf (kind, shape, dtype, a PRNG key's implementation), the
checksum of its values (two wrapping uint32 sums, the same on any device layout and for host
copies), the check of a saved record against the target's leaf, and the placement of the value
read back (the target's sharding, or the default device for an uncommitted target).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fli.config import ConfigError


class CheckpointError(FileNotFoundError):
    """No complete, readable checkpoint where one was asked for; the message names the path."""


class CheckpointMismatch(ConfigError):
    """A checkpoint does not fit the target it is restored into (tree, shape or dtype)."""


def _is_key(x) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _leaf_record(path: str, leaf) -> tuple[dict, Any]:
    """(JSON description, value to hand to orbax) of one state leaf."""
    if isinstance(leaf, jax.Array):
        rec = {"kind": "jax"}
        if _is_key(leaf):
            rec = {"kind": "key", "impl": str(jax.random.key_impl(leaf))}
            leaf = jax.random.key_data(leaf)
        rec |= {"shape": list(leaf.shape), "dtype": str(leaf.dtype)}
        if jax.process_count() > 1 and leaf.is_fully_addressable:
            # orbax refuses process-local arrays in a multi-process save: process 0's copy.
            return rec, np.asarray(leaf)
        return rec, leaf
    if isinstance(leaf, (np.ndarray, np.generic)):
        arr = np.asarray(leaf)
        return {"kind": "numpy", "shape": list(arr.shape), "dtype": str(arr.dtype)}, arr
    if isinstance(leaf, (bool, int, float)):
        arr = np.asarray(leaf)
        return {"kind": type(leaf).__name__, "shape": [], "dtype": str(arr.dtype)}, leaf
    raise TypeError(f"checkpoint state leaf {path or '<root>'} is a {type(leaf).__name__}: "
                    "leaves must be jax Arrays, numpy arrays, bool, int or float")


def _bits(x):
    """The values of ``x`` as uint32 words (traceable): 4-byte types bitcast, smaller ones
    widened, 8-byte ones as two words each, the low word first (as numpy's little-endian view)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    size = jnp.dtype(x.dtype).itemsize
    if size == 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    if size < 4:
        return jax.lax.bitcast_convert_type(x, {1: jnp.uint8, 2: jnp.uint16}[size]).astype(jnp.uint32)
    u = jax.lax.bitcast_convert_type(x, jnp.uint64)  # 8-byte arrays exist only with x64 on
    return jnp.stack([(u & 0xFFFFFFFF).astype(jnp.uint32), (u >> 32).astype(jnp.uint32)], axis=-1)


def _sums(leaves):
    out = []
    for x in leaves:
        b = _bits(x)
        # each element's C-order position, from iotas (no reshape: a sharded array stays put)
        pos, stride = jnp.zeros(b.shape, jnp.uint32), 1
        for d in range(b.ndim - 1, -1, -1):
            pos = pos + jax.lax.broadcasted_iota(jnp.uint32, b.shape, d) * jnp.uint32(stride % 2**32)
            stride *= b.shape[d]
        w = pos * jnp.uint32(2654435761) + jnp.uint32(1)
        out.append(jnp.stack([jnp.sum(b, dtype=jnp.uint32), jnp.sum(b * w, dtype=jnp.uint32)]))
    return out


_sums_jit = jax.jit(_sums)


def _host_sums(a) -> tuple[int, int]:
    """:func:`_sums` of one host array, in numpy (the same words, weights and wrap-around)."""
    a = np.ascontiguousarray(np.asarray(a))
    if a.dtype == np.bool_:
        w = a.astype(np.uint32)
    elif a.dtype.itemsize == 4:
        w = a.view(np.uint32)
    elif a.dtype.itemsize < 4:
        w = a.view({1: np.uint8, 2: np.uint16}[a.dtype.itemsize]).astype(np.uint32)
    else:
        w = a.view("<u4").reshape(*a.shape, a.dtype.itemsize // 4)
    w = w.reshape(-1).astype(np.uint64)
    weights = (np.arange(w.size, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(1)) % np.uint64(2**32)
    return int(w.sum() % 2**32), int((w * weights % np.uint64(2**32)).sum() % 2**32)


def checksums(leaves: list) -> list[str]:
    """A checksum of each leaf's values (a PRNG key's data): ``"u32:<sum>:<weighted sum>"``,
    two wrapping uint32 sums of its words, plain and weighted by position. The same whatever
    the leaf's placement: a global array is summed where it lives (every process gets the
    result), a host or process-local one in numpy."""
    out: list[str | None] = [None] * len(leaves)
    dev = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, jax.Array) and _is_key(leaf):
            leaf = jax.random.key_data(leaf)
        if isinstance(leaf, jax.Array) and not (jax.process_count() > 1 and leaf.is_fully_addressable):
            dev.append((i, leaf))
        else:
            out[i] = "u32:{}:{}".format(*_host_sums(leaf))
    if dev:
        from fli.sim.sharding import replicated_to_host  # noqa: PLC0415

        sums = _sums_jit([x for _, x in dev])
        for (i, _), s in zip(dev, sums, strict=True):
            a, b = (int(v) for v in replicated_to_host(s))
            out[i] = f"u32:{a}:{b}"
    return out




def _first_path_difference(records: list[dict], flat: list) -> str:
    saved = [r["path"] for r in records]
    mine = [jax.tree_util.keystr(kp) for kp, _ in flat]
    for i in range(max(len(saved), len(mine))):
        a = saved[i] if i < len(saved) else None
        b = mine[i] if i < len(mine) else None
        if a != b:
            return f"leaf {i} is {a or '(none)'} in the checkpoint, {b or '(none)'} in the target"
    return "same paths"


def _restore_spec(path: Path, rec: dict, kp: str, leaf):
    """What orbax is asked to read for one leaf, after checking it against the saved record."""
    where = f"checkpoint {path} leaf {kp or '<root>'}"
    if rec["path"] != kp:
        raise CheckpointMismatch(f"{where}: saved as {rec['path'] or '<root>'}; the target's tree "
                                 "differs from the saved one")
    is_key = _is_key(leaf)
    if is_key != (rec["kind"] == "key"):
        raise CheckpointMismatch(f"{where}: saved as {'a PRNG key' if rec['kind'] == 'key' else rec['dtype']}, "
                                 f"target is {'a PRNG key' if is_key else getattr(leaf, 'dtype', type(leaf).__name__)}")
    if isinstance(leaf, (bool, int, float)) and not isinstance(leaf, np.generic):
        shape, dtype = (), np.asarray(leaf).dtype
    elif is_key:
        impl = str(jax.random.key_impl(leaf)) if isinstance(leaf, jax.Array) else None
        if impl is not None and impl != rec["impl"]:
            raise CheckpointMismatch(f"{where}: saved a {rec['impl']} key, target is {impl}")
        key_shape = rec["shape"][len(leaf.shape):]
        shape, dtype = (*leaf.shape, *key_shape), np.dtype(rec["dtype"])
    else:
        shape, dtype = tuple(leaf.shape), np.dtype(leaf.dtype)
    if list(shape) != list(rec["shape"]) or str(dtype) != rec["dtype"]:
        raise CheckpointMismatch(f"{where}: saved {rec['dtype']}{list(rec['shape'])}, target is "
                                 f"{dtype}{list(shape)}")
    if isinstance(leaf, (bool, int, float)) and not isinstance(leaf, np.generic):
        return leaf
    if isinstance(leaf, (np.ndarray, np.generic)):
        return np.asarray(leaf)
    if _placement(leaf) is not None:
        return np.empty(shape, dtype)
    return jax.ShapeDtypeStruct(shape, dtype, sharding=leaf.sharding)


def _empty(rec: dict, leaf):
    """A zero-size leaf, never handed to orbax: rebuilt from its record, on the target's sharding
    where orbax would have read it onto one."""
    value = np.zeros(rec["shape"], rec["dtype"])
    return jax.device_put(value, leaf.sharding) if _placement(leaf) is None else value


def _placement(leaf) -> str | None:
    """How an array leaf not read by orbax onto its sharding is placed after a read as numpy:

    * ``"default"``: an uncommitted array on the default device, as ``jnp.asarray`` makes, for a
      target without a sharding or an uncommitted target (e.g. Optax's ``count``: read onto its
      device it would be committed there, and jit refuses to mix it with mesh arrays);
    * ``"put"``: ``jax.device_put`` onto the target's sharding, for a sharding on this process's
      devices only when there are several processes (orbax refuses those).
    """
    sharding = getattr(leaf, "sharding", None)
    if sharding is None or (isinstance(leaf, jax.Array) and not leaf.committed):
        return "default"
    if jax.process_count() > 1 and sharding.is_fully_addressable:
        return "put"
    return None


def _finish(rec: dict, value, leaf):
    """The restored leaf in the target's form, from what orbax read for it."""
    how = _placement(leaf) if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)) else None
    if how == "default":
        value = jnp.asarray(value)
    elif how == "put":
        value = jax.device_put(value, leaf.sharding)
    if rec["kind"] == "key":
        return jax.random.wrap_key_data(value, impl=rec["impl"])
    if isinstance(leaf, np.generic):
        return leaf.dtype.type(np.asarray(value))
    if isinstance(leaf, (bool, int, float)):
        return type(leaf)(np.asarray(value).item())
    if isinstance(leaf, np.ndarray):
        return np.asarray(value)
    return value
