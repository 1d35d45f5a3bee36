"""Source galaxies: tomographic n(z) bins, shape noise per pixel and the survey mask.

Redshift distributions are normalised on a fixed z grid (Smail forms or tables, from
``SurveyConfig``); the noise per pixel is ``sigma_e / sqrt(n_gal A_pix)`` and is drawn so that
a mock does not depend on the device layout.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

N_Z = 512  # points of the fixed z quadrature grid of every n(z)


# ============================================================================ n(z)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NzBin:
    """A normalised source redshift distribution on a fixed quadrature grid.

    A pytree: ``z`` and ``nz`` are leaves (so a bin may be passed to jitted code), ``n_gal``
    and ``label`` are static.  Build it with :func:`smail_bin`, :func:`table_bin` or
    :func:`nz_bins_from_config`, which validate on the host.

    Attributes:
        z: ``[N_Z]`` increasing redshifts of the quadrature grid (spans the bin's support).
        nz: ``[N_Z]`` n(z) >= 0 normalised so that the trapezoid rule on ``z`` gives 1.
        n_gal: galaxies per arcmin^2 (for the shape noise).
        label: a name used in messages.
    """

    z: Any
    nz: Any
    n_gal: float = dataclasses.field(default=10.0, metadata=dict(static=True))
    label: str = dataclasses.field(default="bin", metadata=dict(static=True))

    @property
    def z_max(self) -> float:
        """Largest redshift with n(z) > 0 (host side)."""
        z, n = np.asarray(self.z), np.asarray(self.nz)
        return float(z[n > 0].max())

    @property
    def z_mean(self) -> float:
        z, n = np.asarray(self.z, float), np.asarray(self.nz, float)
        return float(np.trapezoid(z * n, z))


def _normalise(z: np.ndarray, n: np.ndarray, what: str) -> np.ndarray:
    norm = float(np.trapezoid(n, z))
    if not np.isfinite(norm) or norm <= 0:
        raise ValueError(f"{what}: n(z) integrates to {norm:g}; it must be finite and > 0")
    return n / norm


def smail_bin(z0: float, alpha: float, beta: float, z_min: float, z_max: float,
              n_gal: float = 10.0, label: str = "smail", n_z: int = N_Z) -> NzBin:
    """Smail et al. n(z) ~ z^alpha exp(-(z/z0)^beta), truncated to [z_min, z_max]."""
    if not (0 <= z_min < z_max and z0 > 0 and beta > 0 and math.isfinite(z_max)):
        raise ValueError(f"{label}: need 0 <= z_min < z_max, z0 > 0, beta > 0; got "
                         f"z_min={z_min}, z_max={z_max}, z0={z0}, beta={beta}")
    z = np.linspace(z_min, z_max, n_z)
    with np.errstate(divide="ignore", invalid="ignore"):
        n = np.where(z > 0, z ** alpha, 0.0 if alpha > 0 else 1.0) * np.exp(-((z / z0) ** beta))
    return NzBin(z, _normalise(z, n, label), float(n_gal), label)


def table_bin(z: Sequence[float], nz: Sequence[float], n_gal: float = 10.0,
              label: str = "table", n_z: int = N_Z) -> NzBin:
    """n(z) from a table, linearly interpolated onto ``n_z`` uniform points over [z[0], z[-1]].

    Raises ``ValueError`` (naming ``label``) if z is not strictly increasing, values are not
    finite, z < 0, n(z) < 0 anywhere, or the integral is zero.
    """
    z, nz = np.asarray(z, float), np.asarray(nz, float)
    if z.ndim != 1 or z.shape != nz.shape or z.size < 2:
        raise ValueError(f"{label}: z and nz must be 1D tables of the same length >= 2, got "
                         f"shapes {z.shape} and {nz.shape}")
    if not (np.all(np.isfinite(z)) and np.all(np.isfinite(nz))):
        raise ValueError(f"{label}: the n(z) table has non-finite values")
    if np.any(np.diff(z) <= 0) or z[0] < 0:
        raise ValueError(f"{label}: the n(z) table's z must be >= 0 and strictly increasing")
    if np.any(nz < 0):
        raise ValueError(f"{label}: n(z) must be >= 0, found {nz.min():g} at z = {z[nz.argmin()]:g}")
    zz = np.linspace(z[0], z[-1], n_z)
    n = np.interp(zz, z, nz)
    return NzBin(zz, _normalise(zz, n, label), float(n_gal), label)


def nz_bins_from_config(survey_cfg) -> list[NzBin]:
    """One :class:`NzBin` per ``survey.bins[i]`` (``kind`` smail or table); errors name the bin."""
    bins = []
    for i, b in enumerate(survey_cfg.bins):
        label = f"survey.bins[{i}]"
        if b.kind == "smail":
            bins.append(smail_bin(b.z0, b.alpha, b.beta, b.z_min, b.z_max, b.n_gal, label))
        elif b.kind == "table":
            if b.z is None or b.nz is None:
                raise ValueError(f"{label}: kind 'table' needs z and nz")
            bins.append(table_bin(b.z, b.nz, b.n_gal, label))
        else:
            raise ValueError(f"{label}.kind must be 'smail' or 'table', got {b.kind!r}")
    return bins


def as_bin_list(nz_bins) -> list:
    return [nz_bins] if isinstance(nz_bins, NzBin) else list(nz_bins)


def _trapz_weights(z):
    dz = jnp.diff(z)
    zero = jnp.zeros((1,), z.dtype)
    return 0.5 * (jnp.concatenate([zero, dz]) + jnp.concatenate([dz, zero]))


def result_dtype(cosmo, *xs):
    dt = jnp.result_type(*jax.tree_util.tree_leaves(cosmo), *xs)
    return dt if jnp.issubdtype(dt, jnp.floating) else jnp.result_type(float)


def stack_bins(nz_bins, dt):
    """z, n(z) * trapezoid weights, both ``[n_bins, N]``."""
    nz_bins = as_bin_list(nz_bins)
    sizes = {np.shape(b.z)[0] for b in nz_bins}
    if len(sizes) != 1:
        raise ValueError(f"all n(z) bins must use the same number of z points, got {sorted(sizes)}")
    z = jnp.stack([jnp.asarray(b.z, dt) for b in nz_bins])
    w = jnp.stack([_trapz_weights(jnp.asarray(b.z, dt)) * jnp.asarray(b.nz, dt) for b in nz_bins])
    return z, w


# ============================================================================ noise and mask


def noise_sigma(survey_cfg, fov_deg: float, npix: int) -> np.ndarray:
    """``[n_bins]`` shape noise per pixel sigma_b = sigma_e / sqrt(n_gal_b A_pix), A_pix in arcmin^2."""
    a_pix = (fov_deg * 60.0 / npix) ** 2
    return np.array([survey_cfg.sigma_e / math.sqrt(b.n_gal * a_pix) for b in survey_cfg.bins])


def load_mask(survey_cfg, npix: int) -> np.ndarray | None:
    """The survey mask (``survey.mask``: a .npy boolean ``[npix, npix]``, True = observed) or None."""
    path = getattr(survey_cfg, "mask", None)
    if path is None:
        return None
    try:
        m = np.load(path)
    except OSError as e:
        raise ValueError(f"survey.mask: cannot read {path!r}: {e}") from None
    if m.shape != (npix, npix):
        raise ValueError(f"survey.mask must be a [npix, npix] = [{npix}, {npix}] array, got {m.shape}")
    if m.dtype != bool and not np.all(np.isin(m, (0, 1))):
        raise ValueError("survey.mask must be boolean (True = observed) or 0/1")
    return m.astype(bool)


class NoisyKappa(NamedTuple):
    """A noisy map and what made it: ``kappa`` ``[n_bins, npix, npix]`` (0 where masked),
    ``sigma`` ``[n_bins]`` per-pixel noise, ``mask`` boolean ``[npix, npix]`` (True = observed)."""

    kappa: jax.Array
    sigma: np.ndarray
    mask: np.ndarray


def _place(x: np.ndarray, sharding) -> jax.Array:
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def add_noise(key, kappa, sigma, mask=None) -> NoisyKappa:
    """kappa + sigma_b * N(0, 1) per pixel, set to 0 where ``mask`` is False.

    The noise is drawn as one ``[n_bins, npix, npix]`` array from ``key`` (threefry is
    partitionable, so the draws do not depend on the sharding) and laid out like ``kappa``:
    the result is the same on every device layout.  ``mask``: boolean ``[npix, npix]`` or
    ``[n_bins, npix, npix]`` (None: all observed); it is returned in :class:`NoisyKappa`.
    """
    sharding = getattr(kappa, "sharding", None)
    shape, dt = tuple(kappa.shape), kappa.dtype
    sig = np.broadcast_to(np.asarray(sigma, dtype=np.float64).reshape(-1), (shape[0],)).copy()
    if mask is None:
        mask = np.ones(shape[-2:], bool)
    mask = np.asarray(mask, bool)
    if mask.shape not in (shape[-2:], shape):
        raise ValueError(f"mask must be [npix, npix] = {shape[-2:]} or {shape}, got {mask.shape}")
    draw = jax.jit(lambda k: jax.random.normal(k, shape, dt),
                   out_shardings=sharding if isinstance(sharding, NamedSharding) else None)
    noise = draw(key)
    m = np.broadcast_to(mask, shape)
    if isinstance(sharding, NamedSharding):
        m_dev = _place(np.ascontiguousarray(m), sharding)
    else:
        m_dev = jnp.asarray(m)

    @jax.jit
    def combine(k, n, m):
        return jnp.where(m, k + jnp.asarray(sig, dt)[:, None, None] * n, jnp.zeros((), dt))

    return NoisyKappa(combine(kappa, noise, m_dev), sig, mask)


