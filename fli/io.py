"""Reading and writing run products: sharded arrays in zarr, each process writing its blocks.

The *observation format* (``docs/observation.md``) is a zarr group, ``<dir>/observation.zarr``
(written by ``scripts/make_observation.py``, :func:`write_observation`) or ``<run_dir>/mock.zarr``
(written by ``fli-mock``: an observation that also holds its truth):

* required arrays ``kappa_obs`` ``[n_bins, npix, npix]`` float (convergence), ``noise_sigma``
  ``[n_bins]`` (per-pixel shape noise, > 0), ``nz_z`` and ``nz`` ``[n_bins, N]`` (each bin's
  redshift grid and n(z) >= 0); attributes ``fli_format`` (:data:`FORMAT_VERSION`), ``fov_deg``
  (side of the square map [deg]) and ``units``;
* optional ``mask`` ``[npix, npix]`` bool (True = observed), attribute ``n_gal`` (``[n_bins]``
  galaxies per arcmin^2, informational); the truth of a mock: ``kappa_true``
  ``[n_bins, npix, npix]``, ``white_noise`` ``[nx, ny, nz]``, attributes ``truth``
  (cosmological parameters), ``config`` (the resolved config that made it) and ``seed``;
* ``COMPLETE``, a JSON summary written last (:func:`mark_complete`), after every process has
  written its blocks: a group without it is refused, so an interrupted write never loads.

:func:`load_observation` reads and validates any such group on any device layout;
:func:`load_mock` is the same for callers that need the truth; :func:`check_observation`
compares an observation with the analysis config.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Bool, Float

from fli.files import barrier, jsonable, write_json
from fli.fingerprint import check_group, chunk_hashes, read_verified, record_hashes
from fli.survey import N_Z, NzBin, table_bin

# Version 1 gained nz_z, nz, fov_deg and npix without being bumped: the change only adds
# arrays and attributes, so older readers still read new groups, and this reader rebuilds the
# n(z) bins of older mocks (which lack them) from their ``config`` attribute (see _nz_bins).
FORMAT_VERSION = 1
MOCK_NAME = "mock.zarr"
OBSERVATION_NAME = "observation.zarr"
COMPLETE = "COMPLETE"
_N_GAL_DEFAULT = {f.name: f.default for f in dataclasses.fields(NzBin)}["n_gal"]  # [arcmin^-2]
NORMALISED_RTOL = 1e-10  # a float64 n(z) table integrating to 1 within this is kept as stored (bitwise)

UNITS = {
    "kappa_obs": "convergence (dimensionless)",
    "noise_sigma": "convergence per pixel (Gaussian standard deviation)",
    "mask": "True = observed",
    "nz_z": "redshift",
    "nz": "per unit redshift (normalised to unit integral on reading)",
    "fov_deg": "deg",
}


class MockError(FileNotFoundError):
    """A path does not hold a complete, readable observation (or mock): no group, no
    ``COMPLETE`` marker, unreadable metadata, a required array or attribute missing."""


class ObservationError(MockError, ValueError):
    """An observation's contents are invalid (shapes that disagree, non-finite or out-of-range
    values). Both a :class:`MockError`, so that the console scripts report it in one line with
    exit status 2, and a ``ValueError``."""


def _spec_for(ndim: int, leading: int) -> P:
    """``P(None,..., 'x', 'y', None...)`` with ``leading`` unsharded axes before x and y."""
    return P(*([None] * leading), "x", "y", *([None] * (ndim - leading - 2)))


# ============================================================================ writing


def write_arrays(path: Path, arrays: Mapping[str, jax.Array | np.ndarray], attrs: Mapping[str, Any]) -> None:
    """Write (possibly sharded) arrays into the zarr group at ``path``.

    Process 0 creates the group and array metadata; after a barrier every process writes the
    blocks it holds (one replica of each), chunked by the shard shape. Attributes are JSON.
    Last, each process hashes the chunks it wrote and process 0 records the fingerprint
    (:func:`fli.fingerprint.record_hashes`), which every later read checks.
    """
    import zarr  # noqa: PLC0415

    path = Path(path)
    if jax.process_index() == 0:
        if path.exists():
            shutil.rmtree(path)
        root = zarr.open_group(str(path), mode="w")
        for name, arr in arrays.items():
            root.create_array(name, shape=arr.shape, chunks=_chunk_shape(arr), dtype=np.dtype(arr.dtype))
        root.attrs.update(jsonable(dict(attrs)))
    barrier("fli-io-created")
    root = zarr.open_group(str(path), mode="r+")
    hashes: dict[str, dict[str, str]] = {name: {} for name in arrays}
    for name, arr in arrays.items():
        z = root[name]
        if isinstance(arr, jax.Array):
            for shard in arr.addressable_shards:
                if shard.replica_id == 0:
                    block = np.asarray(shard.data)
                    z[shard.index] = block
                    hashes[name].update(chunk_hashes(block, shard.index, z.shape, z.chunks))
        elif jax.process_index() == 0:
            z[...] = block = np.asarray(arr)
            hashes[name].update(chunk_hashes(block, (), z.shape, z.chunks))
    record_hashes(path, hashes, barrier)


def _chunk_shape(arr) -> tuple[int, ...]:
    if isinstance(arr, jax.Array) and arr.addressable_shards:
        return tuple(int(s) for s in arr.addressable_shards[0].data.shape) or (1,)
    return tuple(int(s) for s in np.shape(arr)) or (1,)


def mark_complete(path: Path, summary: Mapping[str, Any]) -> None:
    """Write the ``COMPLETE`` marker (process 0, after all writes)."""
    barrier("fli-io-before-complete")
    write_json(Path(path) / COMPLETE, jsonable(dict(summary)))
    barrier("fli-io-complete")


def write_observation(path: str | Path,
                      kappa_obs: Float[np.ndarray, "n_bins npix npix"],
                      noise_sigma: Float[np.ndarray, " n_bins"],
                      nz_z: Float[np.ndarray, "n_bins N"] | Float[np.ndarray, " N"],
                      nz: Float[np.ndarray, "n_bins N"],
                      fov_deg: float,
                      mask: Bool[np.ndarray, "npix npix"] | None = None,
                      *, attrs: Mapping[str, Any] | None = None,
                      sources: Mapping[str, str] | None = None,
                      overwrite: bool = False) -> Path:
    """Validate and write an observation group (single process; host arrays).

    Args:
        path: the group to create, conventionally ``<dir>/observation.zarr``.
        kappa_obs: convergence maps, all finite (put 0 in masked pixels).
        noise_sigma: per-pixel Gaussian noise of each bin, > 0.
        nz_z, nz: each bin's redshift grid (one ``[N]`` grid is shared by all bins) and n(z).
        fov_deg: side of the square map [deg].
        mask: True = observed; None: every pixel observed.
        attrs: extra attributes (JSON) stored beside the required ones.
        sources: what each array was made from (``{"kappa_obs": "--kappa k.npy"}``), named in
            error messages instead of the group path.
        overwrite: replace an existing group at ``path`` instead of refusing.
    Returns:
        ``path``, holding the arrays, the attributes and, last, ``COMPLETE``.
    Raises:
        ObservationError: an input is invalid (one line, naming it); nothing is written.
        FileExistsError: ``path`` exists and ``overwrite`` is False.
    """
    path = Path(path)
    sources = dict(sources or {})

    def where(name: str) -> str:
        return sources.get(name, f"{path}/{name}")

    kappa_obs = np.asarray(kappa_obs)
    nz_z, nz = np.asarray(nz_z, np.float64), np.asarray(nz, np.float64)
    if nz_z.ndim == 1 and nz.ndim == 2:
        nz_z = np.broadcast_to(nz_z, nz.shape).copy()
    arrays = {"kappa_obs": kappa_obs, "noise_sigma": np.asarray(noise_sigma, np.float64), "nz_z": nz_z, "nz": nz}
    if mask is not None:
        arrays["mask"] = np.asarray(mask)
    fov = float(fov_deg) if isinstance(fov_deg, (int, float, np.number)) else fov_deg
    full = {**dict(attrs or {}), "fli_format": FORMAT_VERSION, "fov_deg": fov, "units": dict(UNITS)}
    checked = _validate(arrays, full, where)
    _check_finite(int(np.count_nonzero(~np.isfinite(kappa_obs))), kappa_obs.size, where("kappa_obs"))
    if checked.mask is not None:
        arrays["mask"] = checked.mask
    full["npix"] = checked.npix
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists: remove it or choose another output directory")
    try:
        write_arrays(path, arrays, full)
        mark_complete(path, {"n_bins": checked.n_bins, "npix": checked.npix, "fov_deg": checked.fov_deg,
                             "masked_pixels": 0 if checked.mask is None else int((~checked.mask).sum())})
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)  # never leave a half-written group behind
        raise
    return path


# ============================================================================ reading


def read_array(zarr_array, mesh: Mesh | None, leading: int = 0, where: str = "") -> jax.Array | np.ndarray:
    """Read a zarr array; with a ``mesh``, as a sharded array, each process reading its blocks.

    Axes ``leading`` and ``leading + 1`` are sharded over ``('x', 'y')``. Every chunk read is
    checked against the fingerprint recorded when it was written
    (:func:`fli.fingerprint.read_verified`; ``where`` names the array in the error).
    """
    if mesh is None or zarr_array.ndim < leading + 2:
        return read_verified(zarr_array, None, where)
    sharding = NamedSharding(mesh, _spec_for(zarr_array.ndim, leading))
    return jax.make_array_from_callback(zarr_array.shape, sharding,
                                        lambda idx: read_verified(zarr_array, idx, where))


@dataclass(frozen=True)
class Observation:
    """An observation read back from disk (:func:`load_observation`).

    Attributes:
        kappa_obs: ``[n_bins, npix, npix]`` observed convergence (0 where masked); numpy, or
            sharded ``P(None, 'x', 'y')`` when read with a mesh.
        noise_sigma: ``[n_bins]`` per-pixel Gaussian shape noise (convergence), numpy.
        mask: ``[npix, npix]`` bool, True = observed, numpy; None: every pixel observed.
        nz_bins: one :class:`fli.survey.NzBin` per bin, normalised, on ``N_Z`` points.
        fov_deg: side of the square map [deg].
        kappa_true: ``[n_bins, npix, npix]`` noiseless convergence of a mock (sharded like
            ``kappa_obs``), or None.
        white_noise: ``[nx, ny, nz]`` unit Gaussian initial field of a mock (sharded
            ``P('x', 'y')``), or None.
        truth: cosmological parameters of a mock, or None.
        fingerprint: the content fingerprint recorded when it was written
            (:mod:`fli.fingerprint`), or None for one written before fingerprints.
        config: the resolved config that made a mock, or None.
        seed: the mock's seed, or None.
        attrs: every attribute of the group, as stored.
        path: the zarr group read.
    """

    kappa_obs: Any
    noise_sigma: np.ndarray
    mask: np.ndarray | None
    nz_bins: list
    fov_deg: float
    kappa_true: Any = None
    white_noise: Any = None
    truth: dict | None = None
    config: dict | None = None
    seed: int | None = None
    attrs: dict = field(default_factory=dict)
    path: Path | None = None
    fingerprint: str | None = None

    @property
    def has_truth(self) -> bool:
        """True for a mock: ``kappa_true``, ``white_noise`` and ``truth`` are all present."""
        return self.kappa_true is not None and self.white_noise is not None and self.truth is not None

    @property
    def n_bins(self) -> int:
        return int(self.kappa_obs.shape[0])

    @property
    def npix(self) -> int:
        return int(self.kappa_obs.shape[-1])


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


def find_group(path: str | Path, what: str = "observation") -> Path:
    """The observation group at ``path``: ``path`` itself when it is a zarr group, else
    ``path/observation.zarr`` or ``path/mock.zarr`` (exactly one of them)."""
    path = Path(path)
    if path.is_dir() and (path.suffix == ".zarr" or (path / "zarr.json").exists()):
        return path
    found = [path / n for n in (OBSERVATION_NAME, MOCK_NAME) if (path / n).is_dir()]
    if len(found) > 1:
        raise MockError(f"{path} holds both {OBSERVATION_NAME} and {MOCK_NAME}: give the one to read")
    if not found:
        hint = ("no such zarr group" if path.suffix == ".zarr" else
                "give the run directory of a finished fli-mock" if what == "mock" else
                f"expected a zarr group {path}/{OBSERVATION_NAME} (scripts/make_observation.py) or "
                f"{path}/{MOCK_NAME} (fli-mock)")
        raise MockError(f"no {what} at {path}: {hint}")
    return found[0]


def load_observation(path: str | Path, mesh: Mesh | None = None) -> Observation:
    """Read and validate an observation (or a mock) on any device layout.

    The n(z) tables ``nz_z``, ``nz`` become :class:`~fli.survey.NzBin`: a table of
    ``fli.survey.N_Z`` points is used on its own grid (as stored, bitwise, when it already
    integrates to 1 within 1e-10 by the trapezoid rule, as a mock's does; else divided by its
    integral); any other length is interpolated linearly onto ``N_Z`` uniform points
    (:func:`fli.survey.table_bin`). :data:`FORMAT_VERSION` was not bumped when the tables
    joined the format: a mock written before (no ``nz_z``/``nz``/``fov_deg``) gets its bins
    rebuilt from its ``config`` attribute's ``survey`` section with
    :func:`fli.survey.nz_bins_from_config` (the bins that made it) and ``fov_deg`` from
    ``config.lensing.fov_deg``.

    Args:
        path: the observation directory (holding ``observation.zarr`` or ``mock.zarr``) or the
            zarr group itself.
        mesh: device mesh to shard the maps (``P(None, 'x', 'y')``) and the white noise
            (``P('x', 'y')``) over, each process reading its blocks; None returns numpy arrays.
    Raises:
        MockError: no group, no ``COMPLETE`` marker, unreadable, a required array or attribute
            missing.
        ObservationError: shapes that disagree, non-finite ``kappa_obs``, ``noise_sigma`` <= 0,
            a bad mask, an n(z) negative or not integrable. All one line, naming the array.
    """
    return _load(path, mesh, "observation")


def load_mock(run_dir: str | Path, mesh: Mesh | None = None) -> Mock:
    """Read a mock written by ``fli-mock`` on any device layout: :func:`load_observation`
    that also requires the truth (``kappa_true``, ``white_noise``, attribute ``truth``).

    Args:
        run_dir: the fli-mock run directory (or its ``mock.zarr``).
        mesh: device mesh to shard the maps (``P(None, 'x', 'y')``) and the white noise
            (``P('x', 'y')``) over; None returns numpy arrays.
    Raises:
        MockError: the directory holds no complete mock, or arrays are missing or mismatched
            (:class:`ObservationError`, a MockError, for invalid contents).
    """
    obs = _load(run_dir, mesh, "mock")
    if not obs.has_truth:
        missing = [n for n, v in (("kappa_true", obs.kappa_true), ("white_noise", obs.white_noise),
                                  ("truth", obs.truth)) if v is None]
        raise MockError(f"mock at {obs.path} lacks {missing}: it is an observation without the truth of a mock "
                        f"(read it with load_observation)")
    return Mock(kappa_obs=obs.kappa_obs, kappa_true=obs.kappa_true, noise_sigma=obs.noise_sigma,
                white_noise=obs.white_noise, truth=obs.truth, config=obs.config or {}, mask=obs.mask,
                path=obs.path)


def _load(path: str | Path, mesh: Mesh | None, what: str) -> Observation:
    import zarr  # noqa: PLC0415

    group = find_group(path, what)
    if not (group / COMPLETE).is_file():
        raise MockError(f"{what} at {group} is incomplete (no {COMPLETE} marker: the write was interrupted)")
    try:
        with warnings.catch_warnings():  # zarr notes the COMPLETE marker as a foreign object
            warnings.simplefilter("ignore")
            root = zarr.open_group(str(group), mode="r")
            attrs = dict(root.attrs)
            names = set(root.array_keys())
            arrays = {n: root[n] for n in names}
    except Exception as e:  # noqa: BLE001 - any storage error is an unreadable group
        raise MockError(f"{what} at {group} is unreadable: {type(e).__name__}: {_one_line(e)}") from None
    fingerprint = check_group(arrays, attrs, f"{what} at {group}")

    def where(name: str) -> str:
        return f"{what} at {group}: {name}"

    # the small arrays read whole and checked now; the maps and the field per block, below
    arrays = {n: (a if n in _BLOCKWISE else read_verified(a, None, where(n))) for n, a in arrays.items()}
    checked = _validate(arrays, attrs, where)
    kappa_obs = read_array(arrays["kappa_obs"], mesh, leading=1, where=where("kappa_obs"))
    _check_finite(_count_nonfinite(kappa_obs, mesh), int(np.prod(kappa_obs.shape)), where("kappa_obs"))
    config = attrs.get("config")
    return Observation(
        kappa_obs=kappa_obs,
        noise_sigma=checked.noise_sigma,
        mask=checked.mask,
        nz_bins=checked.bins,
        fov_deg=checked.fov_deg,
        kappa_true=(read_array(arrays["kappa_true"], mesh, leading=1, where=where("kappa_true"))
                    if "kappa_true" in names else None),
        white_noise=(read_array(arrays["white_noise"], mesh, leading=0, where=where("white_noise"))
                     if "white_noise" in names else None),
        truth=dict(attrs["truth"]) if isinstance(attrs.get("truth"), Mapping) else None,
        config=dict(config) if isinstance(config, Mapping) else None,
        seed=int(attrs["seed"]) if isinstance(attrs.get("seed"), int) else None,
        attrs=attrs,
        path=group,
        fingerprint=fingerprint,
    )


_BLOCKWISE = ("kappa_obs", "kappa_true", "white_noise")  # read per process, each its blocks


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _count_nonfinite(arr, mesh: Mesh | None) -> int:
    if mesh is None or not isinstance(arr, jax.Array):
        return int(np.count_nonzero(~np.isfinite(np.asarray(arr))))
    import jax.numpy as jnp  # noqa: PLC0415

    count = jax.jit(lambda a: jnp.sum(~jnp.isfinite(a), dtype=jnp.int32),
                    out_shardings=NamedSharding(mesh, P()))(arr)  # replicated: every process reads it
    return int(count)


# ============================================================================ validation


@dataclass(frozen=True)
class _Checked:
    n_bins: int
    npix: int
    noise_sigma: np.ndarray
    mask: np.ndarray | None
    bins: list
    fov_deg: float


def _validate(arrays: Mapping[str, Any], attrs: Mapping[str, Any], where: Callable[[str], str]) -> _Checked:
    """Check the arrays (zarr or numpy: ``.shape``, ``.dtype``, ``[...]``) and attributes of an
    observation, all but the finiteness of ``kappa_obs``; ``where(name)`` names an array in
    messages. Small arrays are read; the maps are not."""
    if "fli_format" not in attrs:
        raise MockError(f"{where('attrs')} lack fli_format (this fli reads format {FORMAT_VERSION})")
    if attrs["fli_format"] != FORMAT_VERSION:
        raise ObservationError(f"{where('fli_format')} is {attrs['fli_format']!r}: this fli reads format "
                               f"{FORMAT_VERSION}")
    missing = [n for n in ("kappa_obs", "noise_sigma") if n not in arrays]
    if missing:
        raise MockError(f"{where('arrays')} lack {missing}: an observation needs kappa_obs [n_bins, npix, npix], "
                        f"noise_sigma [n_bins], nz_z and nz [n_bins, N]")
    ko, ns = arrays["kappa_obs"], arrays["noise_sigma"]
    shape = tuple(int(s) for s in ko.shape)
    if len(shape) != 3 or shape[1] != shape[2] or shape[0] < 1 or shape[1] < 2:
        raise ObservationError(f"{where('kappa_obs')} has shape {list(shape)}: mismatched shapes, it must be "
                               f"[n_bins, npix, npix] with n_bins >= 1 and npix >= 2")
    if not np.issubdtype(ko.dtype, np.floating):
        raise ObservationError(f"{where('kappa_obs')} has dtype {ko.dtype}: it must be float32 or float64")
    n_bins, npix = shape[0], shape[1]
    if tuple(ns.shape) != (n_bins,):
        raise ObservationError(f"{where('noise_sigma')} has shape {list(ns.shape)}: mismatched shapes, kappa_obs "
                               f"{list(shape)} needs [n_bins] = [{n_bins}]")
    if "kappa_true" in arrays and tuple(arrays["kappa_true"].shape) != shape:
        raise ObservationError(f"{where('kappa_true')} has shape {list(arrays['kappa_true'].shape)}: mismatched "
                               f"shapes, it must be kappa_obs's {list(shape)}")
    if "white_noise" in arrays and len(arrays["white_noise"].shape) != 3:
        raise ObservationError(f"{where('white_noise')} has shape {list(arrays['white_noise'].shape)}: mismatched "
                               f"shapes, it must be [nx, ny, nz]")
    if "npix" in attrs and attrs["npix"] != npix:
        raise ObservationError(f"{where('npix')} is {attrs['npix']!r}: mismatched shapes, kappa_obs {list(shape)} "
                               f"has npix = {npix}")
    sigma = np.asarray(ns[...], dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(sigma) & (sigma > 0)))
    if bad.size:
        raise ObservationError(f"{where('noise_sigma')} of bin {int(bad[0])} is {sigma[bad[0]]:g}: every bin's "
                               f"per-pixel noise must be finite and > 0")
    mask = _check_mask(arrays["mask"], npix, where) if "mask" in arrays else None
    config = attrs.get("config") if isinstance(attrs.get("config"), Mapping) else {}
    fov = attrs.get("fov_deg", config.get("lensing", {}).get("fov_deg"))
    if fov is None:
        raise MockError(f"{where('attrs')} lack fov_deg (side of the square map in degrees)")
    if isinstance(fov, bool) or not isinstance(fov, (int, float)) or not (math.isfinite(fov) and 0 < fov < 180):
        raise ObservationError(f"{where('fov_deg')} is {fov!r}: it must be the map side in degrees, in (0, 180)")
    if "units" not in attrs:
        raise MockError(f"{where('attrs')} lack units (a mapping from each array to its unit)")
    bins = _nz_bins(arrays, attrs, n_bins, where)
    return _Checked(n_bins, npix, sigma, mask, bins, float(fov))


def _check_mask(arr, npix: int, where) -> np.ndarray:
    if tuple(arr.shape) != (npix, npix):
        raise ObservationError(f"{where('mask')} has shape {list(arr.shape)}: mismatched shapes, kappa_obs needs "
                               f"[npix, npix] = [{npix}, {npix}]")
    m = np.asarray(arr[...])
    if m.dtype != bool:
        if not (np.issubdtype(m.dtype, np.integer) and np.all(np.isin(m, (0, 1)))):
            raise ObservationError(f"{where('mask')} has dtype {m.dtype}: it must be boolean (True = observed) "
                                   f"or integers 0/1")
        m = m.astype(bool)
    if not m.any():
        raise ObservationError(f"{where('mask')} observes no pixel: True marks the observed pixels")
    return m


def _check_finite(n_bad: int, total: int, name: str) -> None:
    if n_bad:
        raise ObservationError(f"{name} has {n_bad} non-finite pixel(s) of {total}: every value must be finite "
                               f"(put 0 in masked pixels and mark them False in the mask)")


def _nz_bins(arrays, attrs, n_bins: int, where) -> list:
    have = [n for n in ("nz_z", "nz") if n in arrays]
    config = attrs.get("config")
    if not have and isinstance(config, Mapping) and "survey" in config:
        return _bins_from_config(config["survey"], n_bins, where)
    if len(have) < 2:
        raise MockError(f"{where('arrays')} lack {[n for n in ('nz_z', 'nz') if n not in have]}: an observation "
                        f"needs each bin's n(z) table, nz_z and nz [n_bins, N]")
    zs, ns = arrays["nz_z"], arrays["nz"]
    for name, a in (("nz_z", zs), ("nz", ns)):
        if len(a.shape) != 2 or a.shape[0] != n_bins or a.shape[1] < 2:
            raise ObservationError(f"{where(name)} has shape {list(a.shape)}: mismatched shapes, kappa_obs needs "
                                   f"[n_bins, N] = [{n_bins}, N] with N >= 2")
    if tuple(zs.shape) != tuple(ns.shape):
        raise ObservationError(f"{where('nz')} has shape {list(ns.shape)}: mismatched shapes, nz_z is "
                               f"{list(zs.shape)}")
    z_all, n_all = np.asarray(zs[...]), np.asarray(ns[...])  # kept in their dtype: a mock's bins, bitwise
    if not (np.issubdtype(z_all.dtype, np.floating) and np.issubdtype(n_all.dtype, np.floating)):
        z_all, n_all = z_all.astype(np.float64), n_all.astype(np.float64)
    n_gal = attrs.get("n_gal")
    if not (isinstance(n_gal, list) and len(n_gal) == n_bins and all(isinstance(g, (int, float)) and g > 0
                                                                      for g in n_gal)):
        n_gal = [_N_GAL_DEFAULT] * n_bins  # informational only: the likelihood uses noise_sigma
    bins = []
    for i in range(n_bins):
        z, n = z_all[i], n_all[i]
        label = f"nz[{i}]"
        if not (np.all(np.isfinite(z)) and np.all(np.isfinite(n))):
            raise ObservationError(f"{where('nz_z/nz')} of bin {i} have non-finite values")
        if z[0] < 0 or np.any(np.diff(z) <= 0):
            k = int(np.argmax(np.diff(z) <= 0)) + 1 if z[0] >= 0 else 0
            raise ObservationError(f"{where('nz_z')} of bin {i} must be >= 0 and strictly increasing, got "
                                   f"z[{k}] = {z[k]:g}" + (f" after {z[k - 1]:g}" if k else ""))
        if np.any(n < 0):
            raise ObservationError(f"{where('nz')} of bin {i} is negative, {n.min():g} at z = {z[n.argmin()]:g}: "
                                   f"n(z) must be >= 0")
        norm = float(np.trapezoid(n.astype(np.float64), z.astype(np.float64)))
        if not (math.isfinite(norm) and norm > 0):
            raise ObservationError(f"{where('nz')} of bin {i} integrates to {norm:g} over z in [{z[0]:g}, {z[-1]:g}]: "
                                   f"n(z) must have a finite, positive integral")
        if z.size == N_Z:
            tol = max(NORMALISED_RTOL, 100 * float(np.finfo(n.dtype).eps))  # float32 tables: 1e-5
            nz = n if abs(norm - 1) <= tol else n / norm
            bins.append(NzBin(z, nz, float(n_gal[i]), label))
        else:
            bins.append(table_bin(z, n, float(n_gal[i]), label))
    return bins


def _bins_from_config(survey: Mapping, n_bins: int, where) -> list:
    """The bins of a mock written before ``nz_z``/``nz`` joined the format, from its config."""
    from omegaconf import OmegaConf  # noqa: PLC0415

    from fli.config import SurveyConfig  # noqa: PLC0415
    from fli.survey import nz_bins_from_config  # noqa: PLC0415

    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SurveyConfig), dict(survey)))
        bins = nz_bins_from_config(cfg)
    except Exception as e:  # noqa: BLE001 - any failure here is an unusable config attribute
        raise ObservationError(f"{where('config.survey')} cannot rebuild the n(z) bins (no nz_z/nz tables): "
                               f"{_one_line(e)}") from None
    if len(bins) != n_bins:
        raise ObservationError(f"{where('config.survey.bins')} has {len(bins)} bins: mismatched shapes, kappa_obs "
                               f"has {n_bins}")
    return bins


# ============================================================================ against the config


def check_observation(obs: Observation, cfg) -> None:
    """Refuse an analysis config that disagrees with the observation it is run on.

    Checks ``lensing.npix`` (map size), the number of ``survey.bins`` (only the count: the
    analysis takes each bin's n(z) from the observation), ``lensing.fov_deg`` and, for a mock,
    ``simulation.mesh`` (the shape of its white noise) and ``simulation.box`` (its config's).
    Divisibility of npix by ``distributed.pdims`` is checked with the lens geometry.

    Args:
        obs: from :func:`load_observation`.
        cfg: a validated :class:`fli.config.Config`.
    Raises:
        fli.config.ConfigError: one line naming the key, the config's value and the observation's.
    """
    from fli.config import ConfigError  # noqa: PLC0415

    src = obs.path
    lc = cfg.lensing
    if lc.npix != obs.npix:
        raise ConfigError(f"lensing.npix = {lc.npix} but the observation {src} has {obs.npix} x {obs.npix} "
                          f"pixel maps: set lensing.npix={obs.npix}")
    nb = len(cfg.survey.bins)
    if nb != obs.n_bins:
        raise ConfigError(f"survey.bins has {nb} bin(s) but the observation {src} has {obs.n_bins}: give "
                          f"{obs.n_bins} bins (their n(z) is taken from the observation; only the count must agree)")
    if not math.isclose(lc.fov_deg, obs.fov_deg, rel_tol=1e-9):
        raise ConfigError(f"lensing.fov_deg = {lc.fov_deg:g} but the observation {src} covers {obs.fov_deg:g} deg: "
                          f"set lensing.fov_deg={obs.fov_deg:g}")
    if obs.white_noise is not None:
        wn = [int(s) for s in obs.white_noise.shape]
        if list(cfg.simulation.mesh) != wn:
            raise ConfigError(f"simulation.mesh = {list(cfg.simulation.mesh)} but the mock {src} has white noise "
                              f"{wn}: set simulation.mesh=[{','.join(map(str, wn))}]")
    box = ((obs.config or {}).get("simulation") or {}).get("box")
    if box is not None:
        box = [float(b) for b in box]
        if len(box) != 3 or not np.allclose(cfg.simulation.box, box, rtol=1e-9, atol=0):
            raise ConfigError(f"simulation.box = {list(cfg.simulation.box)} but the mock {src} was made with box "
                              f"{box} Mpc/h: set simulation.box=[{','.join(f'{b:g}' for b in box)}]")
