"""The observation format (docs/observation.md): its names and version, the errors a reader
raises, and the checks of a group's arrays and attributes.

:mod:`fli.store.io` reads and writes the groups; everything here works on what it hands over (zarr
arrays or numpy arrays, the attributes as a mapping), so a group is judged before any of it
is put on devices.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fli.lensing.survey import N_Z, NzBin, table_bin

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





def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


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
    from fli.lensing.survey import nz_bins_from_config  # noqa: PLC0415

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
