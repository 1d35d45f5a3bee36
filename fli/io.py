"""Reading and writing run products: sharded arrays in zarr, each process writing its blocks.

A mock (``fli-mock``) is the zarr group ``<run_dir>/mock.zarr`` holding

* ``kappa_obs`` and ``kappa_true`` ``[n_bins, npix, npix]``, ``white_noise`` ``[nx, ny, nz]``,
  ``noise_sigma`` ``[n_bins]``, optionally ``mask`` ``[npix, npix]``;
* attributes ``truth`` (cosmological parameters), ``config`` (the resolved config), and
  ``fli_format`` (the version of this layout),

plus ``<run_dir>/mock.zarr/COMPLETE``, written last, after every process has written its
blocks. :func:`load_mock` refuses a mock without it, so an interrupted write never loads as
complete.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

FORMAT_VERSION = 1
MOCK_NAME = "mock.zarr"
COMPLETE = "COMPLETE"


class MockError(FileNotFoundError):
    """A run directory does not hold a complete, readable mock."""


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils  # noqa: PLC0415

        multihost_utils.sync_global_devices(name)


def _spec_for(ndim: int, leading: int) -> P:
    """``P(None,..., 'x', 'y', None...)`` with ``leading`` unsharded axes before x and y."""
    return P(*([None] * leading), "x", "y", *([None] * (ndim - leading - 2)))


def write_arrays(path: Path, arrays: Mapping[str, jax.Array | np.ndarray], attrs: Mapping[str, Any]) -> None:
    """Write (possibly sharded) arrays into the zarr group at ``path``.

    Process 0 creates the group and array metadata; after a barrier every process writes the
    blocks it holds (one replica of each), chunked by the shard shape. Attributes are JSON.
    """
    import zarr  # noqa: PLC0415

    path = Path(path)
    if jax.process_index() == 0:
        if path.exists():
            shutil.rmtree(path)
        root = zarr.open_group(str(path), mode="w")
        for name, arr in arrays.items():
            chunks = _chunk_shape(arr)
            root.create_array(name, shape=arr.shape, chunks=chunks, dtype=np.dtype(arr.dtype))
        root.attrs.update(_jsonable(dict(attrs)))
    _barrier("fli-io-created")
    root = zarr.open_group(str(path), mode="r+")
    for name, arr in arrays.items():
        z = root[name]
        if isinstance(arr, jax.Array):
            for shard in arr.addressable_shards:
                if shard.replica_id == 0:
                    z[shard.index] = np.asarray(shard.data)
        elif jax.process_index() == 0:
            z[...] = np.asarray(arr)
    _barrier("fli-io-written")


def _chunk_shape(arr) -> tuple[int, ...]:
    if isinstance(arr, jax.Array) and arr.addressable_shards:
        return tuple(int(s) for s in arr.addressable_shards[0].data.shape) or (1,)
    return tuple(int(s) for s in np.shape(arr)) or (1,)


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def mark_complete(path: Path, summary: Mapping[str, Any]) -> None:
    """Write the ``COMPLETE`` marker (process 0, after all writes)."""
    _barrier("fli-io-before-complete")
    if jax.process_index() == 0:
        tmp = Path(path) / (COMPLETE + ".tmp")
        tmp.write_text(json.dumps(_jsonable(dict(summary)), indent=1))
        tmp.rename(Path(path) / COMPLETE)
    _barrier("fli-io-complete")


def read_array(zarr_array, mesh: Mesh | None, leading: int = 0) -> jax.Array | np.ndarray:
    """Read a zarr array; with a ``mesh``, as a sharded array, each process reading its blocks.

    Axes ``leading`` and ``leading + 1`` are sharded over ``('x', 'y')``.
    """
    if mesh is None or zarr_array.ndim < leading + 2:
        return np.asarray(zarr_array[...])
    sharding = NamedSharding(mesh, _spec_for(zarr_array.ndim, leading))
    return jax.make_array_from_callback(zarr_array.shape, sharding, lambda idx: np.asarray(zarr_array[idx]))


@dataclass
class Mock:
    """A mock observation read back from disk (arrays sharded when a mesh was given)."""

    kappa_obs: Any
    kappa_true: Any
    noise_sigma: np.ndarray
    white_noise: Any
    truth: dict
    config: dict
    mask: np.ndarray | None
    path: Path


_REQUIRED = ("kappa_obs", "kappa_true", "noise_sigma", "white_noise")


def load_mock(run_dir: str | Path, mesh: Mesh | None = None) -> Mock:
    """Read a mock written by ``fli-mock`` on any device layout.

    Args:
        run_dir: the fli-mock run directory (or its ``mock.zarr``).
        mesh: device mesh to shard the maps (``P(None, 'x', 'y')``) and the white noise
            (``P('x', 'y')``) over; None returns numpy arrays.
    Raises:
        MockError: the directory holds no complete mock, or arrays are missing or mismatched.
    """
    import zarr  # noqa: PLC0415

    path = Path(run_dir)
    if path.name != MOCK_NAME:
        path = path / MOCK_NAME
    if not path.is_dir():
        raise MockError(f"no mock at {path}: give the run directory of a finished fli-mock")
    if not (path / COMPLETE).is_file():
        raise MockError(f"mock at {path} is incomplete (no {COMPLETE} marker: the write was interrupted)")
    try:
        with warnings.catch_warnings():  # zarr notes the COMPLETE marker as a foreign object
            warnings.simplefilter("ignore")
            root = zarr.open_group(str(path), mode="r")
            attrs = dict(root.attrs)
            names = set(root.array_keys())
    except Exception as e:  # noqa: BLE001 - any storage error is an unreadable mock
        raise MockError(f"mock at {path} is unreadable: {type(e).__name__}: {e}") from None
    missing = [n for n in _REQUIRED if n not in names]
    if missing or attrs.get("fli_format") != FORMAT_VERSION:
        raise MockError(f"mock at {path} lacks {missing or 'fli_format'} (format {attrs.get('fli_format')}, "
                        f"expected {FORMAT_VERSION})")
    ko, kt, ns = root["kappa_obs"], root["kappa_true"], root["noise_sigma"]
    if ko.shape != kt.shape or ko.ndim != 3 or ns.shape != (ko.shape[0],):
        raise MockError(f"mock at {path} has mismatched shapes: kappa_obs {ko.shape}, kappa_true {kt.shape}, "
                        f"noise_sigma {ns.shape}")
    return Mock(
        kappa_obs=read_array(ko, mesh, leading=1),
        kappa_true=read_array(kt, mesh, leading=1),
        noise_sigma=np.asarray(ns[...]),
        white_noise=read_array(root["white_noise"], mesh, leading=0),
        truth=dict(attrs.get("truth", {})),
        config=dict(attrs.get("config", {})),
        mask=np.asarray(root["mask"][...]) if "mask" in names else None,
        path=path,
    )
