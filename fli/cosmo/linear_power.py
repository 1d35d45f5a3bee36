"""The linear matter power spectrum: Eisenstein & Hu's transfer function, normalised to sigma8.

``P(k, a) = A k^n_s T_EH(k)^2 D1(a)^2`` in (Mpc/h)^3 for ``k`` in h/Mpc, with ``A`` fixed by the
rms linear density contrast in top-hat spheres of 8 Mpc/h today (``sigma_R(8, 1) = sigma8``).
The growth factor ``D1`` and the dtype conventions are :mod:`fli.cosmo.background`'s; like it, every
function here is a pure JAX function of a :class:`~fli.cosmo.background.Cosmology` pytree.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from fli.cosmo.background import Cosmology, GrowthTable, _cast, _d1, _solve

_LNK_MIN, _LNK_MAX, _N_K = math.log(1e-5), math.log(1e2), 2049  # sigma_R quadrature [h/Mpc]


def eisenstein_hu_transfer(cosmo: Cosmology, k, T_cmb: float | None = None):
    """Eisenstein & Hu (1998, ApJ 496, 605) matter transfer function with baryon acoustic
    oscillations (their eqs. 2-24, sound horizon from eq. 6), for k in h/Mpc.  Needs k > 0
    (T -> 1 as k -> 0; k = 0 itself gives NaN, see :func:`linear_power` for the guard)."""
    p, k = _cast(cosmo, k)
    h, fb, fc = p.h, p.Omega_b / p.Omega_m, p.Omega_c / p.Omega_m
    wm, wb = p.Omega_m * h ** 2, p.Omega_b * h ** 2
    th = (cosmo.T_cmb if T_cmb is None else T_cmb) / 2.7
    kk = k * h  # 1/Mpc
    z_eq = 2.50e4 * wm * th ** -4  # eq. 2
    k_eq = 7.46e-2 * wm * th ** -2  # eq. 3, 1/Mpc
    b1 = 0.313 * wm ** -0.419 * (1.0 + 0.607 * wm ** 0.674)  # eq. 4
    b2 = 0.238 * wm ** 0.223
    z_d = 1291.0 * wm ** 0.251 / (1.0 + 0.659 * wm ** 0.828) * (1.0 + b1 * wb ** b2)
    r_d = 31.5 * wb * th ** -4 * (1e3 / z_d)  # eq. 5: baryon/photon momentum ratio
    r_eq = 31.5 * wb * th ** -4 * (1e3 / z_eq)
    s = (2.0 / (3.0 * k_eq) * jnp.sqrt(6.0 / r_eq)  # eq. 6: sound horizon [Mpc]
         * jnp.log((jnp.sqrt(1.0 + r_d) + jnp.sqrt(r_d + r_eq)) / (1.0 + jnp.sqrt(r_eq))))
    k_silk = 1.6 * wb ** 0.52 * wm ** 0.73 * (1.0 + (10.4 * wm) ** -0.95)  # eq. 7
    q = kk / (13.41 * k_eq)  # eq. 10
    a1 = (46.9 * wm) ** 0.670 * (1.0 + (32.1 * wm) ** -0.532)  # eq. 11
    a2 = (12.0 * wm) ** 0.424 * (1.0 + (45.0 * wm) ** -0.582)
    alpha_c = a1 ** -fb * a2 ** -(fb ** 3)
    c1 = 0.944 / (1.0 + (458.0 * wm) ** -0.708)  # eq. 12
    c2 = (0.395 * wm) ** -0.0266
    beta_c = 1.0 / (1.0 + c1 * (fc ** c2 - 1.0))
    yy = (1.0 + z_eq) / (1.0 + z_d)  # eq. 15
    sq = jnp.sqrt(1.0 + yy)
    gy = yy * (-6.0 * sq + (2.0 + 3.0 * yy) * jnp.log((sq + 1.0) / (sq - 1.0)))
    alpha_b = 2.07 * k_eq * s * (1.0 + r_d) ** -0.75 * gy  # eq. 14
    beta_node = 8.41 * wm ** 0.435  # eq. 23
    beta_b = 0.5 + fb + (3.0 - 2.0 * fb) * jnp.sqrt((17.2 * wm) ** 2 + 1.0)  # eq. 24

    def t0(alpha, beta):  # eqs. 19-20
        lg = jnp.log(jnp.e + 1.8 * beta * q)
        return lg / (lg + (14.2 / alpha + 386.0 / (1.0 + 69.9 * q ** 1.08)) * q ** 2)

    ks = kk * s
    f = 1.0 / (1.0 + (ks / 5.4) ** 4)  # eq. 18
    t_c = f * t0(1.0, beta_c) + (1.0 - f) * t0(alpha_c, beta_c)  # eq. 17
    x = kk * s / (1.0 + (beta_node / ks) ** 3) ** (1.0 / 3.0)  # eq. 22: k * s_tilde
    t_b = (t0(1.0, 1.0) / (1.0 + (ks / 5.2) ** 2)  # eq. 21
           + alpha_b / (1.0 + (beta_b / ks) ** 3) * jnp.exp(-((kk / k_silk) ** 1.4))) * jnp.sin(x) / x
    return fb * t_b + fc * t_c  # eq. 16


def _tophat(x):
    """Fourier transform of a unit top-hat, 3 (sin x - x cos x) / x^3; Taylor series below
    x = 0.5 (truncation < 1e-11; avoids the float32 cancellation of the closed form)."""
    small = x < 0.5
    xs = jnp.where(small, 1.0, x)
    big = 3.0 * (jnp.sin(xs) - xs * jnp.cos(xs)) / xs ** 3
    x2 = x * x
    series = 1.0 + x2 * (-1 / 10 + x2 * (1 / 280 + x2 * (-1 / 15120 + x2 / 1330560)))
    return jnp.where(small, series, big)


def _sigma2_unnorm(p: Cosmology, R):
    """int dlnk k^3 k^n_s T(k)^2 W(kR)^2 / (2 pi^2) by Simpson's rule on a log-k grid."""
    dt = p.Omega_c.dtype
    lnk = jnp.linspace(_LNK_MIN, _LNK_MAX, _N_K, dtype=dt)
    k = jnp.exp(lnk)
    dlnk = (_LNK_MAX - _LNK_MIN) / (_N_K - 1)  # exact step (lnk[1] - lnk[0] is not, in float32)
    w = jnp.ones(_N_K, dt).at[1:-1:2].set(4.0).at[2:-1:2].set(2.0) * (dlnk / 3.0)
    pk = k ** (3.0 + p.n_s) * eisenstein_hu_transfer(p, k) ** 2 / (2.0 * jnp.pi ** 2)
    win = _tophat(jnp.asarray(R, dt)[..., None] * k)
    return jnp.sum(w * pk * win ** 2, axis=-1)


def _amplitude(p: Cosmology):
    """A such that P(k, a=1) = A k^n_s T(k)^2 has sigma(R = 8 Mpc/h) = sigma8."""
    return p.sigma8 ** 2 / _sigma2_unnorm(p, 8.0)


def linear_power(cosmo: Cosmology, k, a=1.0, table: GrowthTable | None = None):
    """Linear matter power spectrum P(k, a) = A k^n_s T_EH(k)^2 D1(a)^2 in (Mpc/h)^3.

    ``k`` [h/Mpc] and ``a`` broadcast against each other (e.g. ``k[:, None], a[None, :]``
    for a (nk, na) table).  A is fixed by sigma(8 Mpc/h, a=1) = sigma8.  P(k=0) = 0 with
    finite gradients.
    """
    p, k, a = _cast(cosmo, k, a)
    tab = _solve(p) if table is None else table
    pos = k > 0
    ks = jnp.where(pos, k, 1.0)  # double-where guard for k = 0
    pk = _amplitude(p) * ks ** p.n_s * eisenstein_hu_transfer(p, ks) ** 2
    return jnp.where(pos, pk, 0.0) * _d1(p, tab, a) ** 2


def sigma_R(cosmo: Cosmology, R, a=1.0):
    """rms linear density contrast in top-hat spheres of radius R [Mpc/h] at scale factor a
    (R and a broadcast); sigma_R(8, 1) = sigma8 by construction."""
    p, R, a = _cast(cosmo, R, a)
    return jnp.sqrt(_amplitude(p) * _sigma2_unnorm(p, R)) * _d1(p, _solve(p), a)
