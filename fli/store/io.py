"""Reading and writing run products: sharded arrays in zarr, each process writing its blocks.

The *observation format* (``docs/observation.md``) is a zarr group, ``<dir>/observation.zarr``
(written by ``fli-observe``, :func:`write_observation`) or ``<run_dir>/mock.zarr``
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
compares an observation with the analysis config. The format's names, its errors and the
checks of a group's contents are :mod:`fli.store.observation`'s.
"""

from __future__ import annotations

import math
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Bool, Float

from fli.store.files import barrier, jsonable, write_json
from fli.store.fingerprint import check_group, chunk_hashes, read_verified, record_hashes
from fli.store.observation import (  # noqa: F401  (the format's names and errors are fli.store.io's too)
    COMPLETE,
    FORMAT_VERSION,
    MOCK_NAME,
    NORMALISED_RTOL,
    OBSERVATION_NAME,
    UNITS,
    MockError,
    ObservationError,
    _bins_from_config,
    _check_finite,
    _check_mask,
    _nz_bins,
    _one_line,
    _validate,
)


def _spec_for(ndim: int, leading: int) -> P:
    """``P(None,..., 'x', 'y', None...)`` with ``leading`` unsharded axes before x and y."""
    return P(*([None] * leading), "x", "y", *([None] * (ndim - leading - 2)))


# ============================================================================ writing


def write_arrays(path: Path, arrays: Mapping[str, jax.Array | np.ndarray], attrs: Mapping[str, Any]) -> None:
    """Write (possibly sharded) arrays into the zarr group at ``path``.

    Process 0 creates the group and array metadata; after a barrier every process writes the
    blocks it holds (one replica of each), chunked by the shard shape. Attributes are JSON.
    Last, each process hashes the chunks it wrote and process 0 records the fingerprint
    (:func:`fli.store.fingerprint.record_hashes`), which every later read checks.
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
    (:func:`fli.store.fingerprint.read_verified`; ``where`` names the array in the error).
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
        nz_bins: one :class:`fli.lensing.survey.NzBin` per bin, normalised, on ``N_Z`` points.
        fov_deg: side of the square map [deg].
        kappa_true: ``[n_bins, npix, npix]`` noiseless convergence of a mock (sharded like
            ``kappa_obs``), or None.
        white_noise: ``[nx, ny, nz]`` unit Gaussian initial field of a mock (sharded
            ``P('x', 'y')``), or None.
        truth: cosmological parameters of a mock, or None.
        fingerprint: the content fingerprint recorded when it was written
            (:mod:`fli.store.fingerprint`), or None for one written before fingerprints.
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
                f"expected a zarr group {path}/{OBSERVATION_NAME} (fli-observe) or "
                f"{path}/{MOCK_NAME} (fli-mock)")
        raise MockError(f"no {what} at {path}: {hint}")
    return found[0]


def load_observation(path: str | Path, mesh: Mesh | None = None) -> Observation:
    """Read and validate an observation (or a mock) on any device layout.

    The n(z) tables ``nz_z``, ``nz`` become :class:`~fli.lensing.survey.NzBin`: a table of
    ``fli.lensing.survey.N_Z`` points is used on its own grid (as stored, bitwise, when it already
    integrates to 1 within 1e-10 by the trapezoid rule, as a mock's does; else divided by its
    integral); any other length is interpolated linearly onto ``N_Z`` uniform points
    (:func:`fli.lensing.survey.table_bin`). :data:`FORMAT_VERSION` was not bumped when the tables
    joined the format: a mock written before (no ``nz_z``/``nz``/``fov_deg``) gets its bins
    rebuilt from its ``config`` attribute's ``survey`` section with
    :func:`fli.lensing.survey.nz_bins_from_config` (the bins that made it) and ``fov_deg`` from
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


def _count_nonfinite(arr, mesh: Mesh | None) -> int:
    if mesh is None or not isinstance(arr, jax.Array):
        return int(np.count_nonzero(~np.isfinite(np.asarray(arr))))
    import jax.numpy as jnp  # noqa: PLC0415

    count = jax.jit(lambda a: jnp.sum(~jnp.isfinite(a), dtype=jnp.int32),
                    out_shardings=NamedSharding(mesh, P()))(arr)  # replicated: every process reads it
    return int(count)


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
