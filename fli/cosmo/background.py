"""Differentiable flat LambdaCDM (+ w0/wa dark energy) background and growth.

Pure JAX functions of a :class:`Cosmology` pytree: ``jax.grad``, ``jit`` and ``vmap`` apply to every
parameter, and the dtype (float32 or float64) follows the parameters and inputs.

* Units: scale factor ``a`` (1 today); distances in Mpc/h, ``k`` in h/Mpc, power in (Mpc/h)^3.
* Content: matter (CDM + baryons, no massive neutrinos); radiation (photons at ``T_cmb``, ``N_eff``
  massless neutrinos, counted as CCL does; ``radiation=False`` sets ``Omega_r = 0``, while ``T_cmb``
  still enters :mod:`fli.cosmo.linear_power`); dark energy ``w(a) = w0 + wa (1 - a)``,
  ``Omega_de = 1 - Omega_m - Omega_r``.
* Growth: ``D1`` the linear growing mode, ``D1(a=1) = 1``; ``D2`` the 2LPT factor,
  ``D2 -> -(3/7) D1^2`` early, so that ``Psi = -D1 grad(phi1) + D2 grad(phi2)`` with
  ``laplacian(phi1) = delta_lin(a=1)``, ``laplacian(phi2) = sum_{i>j} (phi1_ii phi1_jj - phi1_ij^2)``;
  ``D2'' + (2 + dlnE/dlna) D2' - 1.5 Omega_m(a) D2 = -1.5 Omega_m(a) D1^2`` (' = d/dlna).

Numerics: RK4 (a ``lax.scan``) on 440 uniform steps in ln a from ``a = 1e-5``, started on the matter +
radiation growing modes (Meszaros), to ``a_max ~ 1.24``; distances by Simpson's rule on the same grid;
cubic Hermite interpolation between nodes (error ~1e-7); closed forms below the table, clamped above.
Each function solves afresh (440 sequential steps) unless given ``table=growth_table(cosmo)``: build it
once per jitted computation that needs several growth quantities, and pass arrays of ``a``, not loops.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

C_OVER_H0 = 2997.92458  # c / H0 in Mpc/h (c = 299792.458 km/s, H0 = 100 h km/s/Mpc)
T_CMB = 2.7255  # K (Fixsen 2009), CCL's default
N_EFF = 3.044  # effective number of massless neutrino species, CCL's default
# Photon density today times h^2 at T_CMB: 4 sigma_SB T^4 / c^3 over rho_crit / h^2 =
# 3 (100 km/s/Mpc)^2 / (8 pi G), with CODATA 2018 sigma_SB, G and c and CCL's Mpc in metres
_SIGMA_SB, _C_SI, _G_SI, _MPC_M = 5.670374419e-8, 299792458.0, 6.67430e-11, 3.085677581491367e22
_RHO_CRIT_H2 = 3.0 * (1e5 / _MPC_M) ** 2 / (8.0 * math.pi * _G_SI)  # kg / m^3
OMEGA_G_H2 = 4.0 * _SIGMA_SB * T_CMB ** 4 / _C_SI ** 3 / _RHO_CRIT_H2  # 2.4729e-5
# each massless neutrino species: 7/8 (4/11)^(4/3) of the photons' density
_NU_PER_SPECIES = 7.0 / 8.0 * (4.0 / 11.0) ** (4.0 / 3.0)

_A_MIN = 1e-5  # start of the growth/distance table (radiation era: a_eq ~ 3e-4)
_N_TO_ONE = 432  # RK4 steps from ln(_A_MIN) to ln(1) = 0 (a = 1 is a grid node)
_N_EXTRA = 8  # extra steps beyond a = 1 (up to a_max = exp(8 * 11.513 / 432) ~ 1.24)
_DY = -math.log(_A_MIN) / _N_TO_ONE



@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Cosmology:
    """Flat w0waCDM parameters; every field is a pytree leaf (differentiable).

    Attributes:
        Omega_c: cold dark matter density today, in units of the critical density.
        Omega_b: baryon density today.
        h: H0 / (100 km/s/Mpc).
        n_s: scalar spectral index of the primordial power spectrum.
        sigma8: rms linear density contrast in top-hat spheres of 8 Mpc/h at a = 1.
        w0, wa: dark-energy equation of state w(a) = w0 + wa (1 - a).
        radiation: photons and massless neutrinos in the expansion history (static, not a
            leaf). False reproduces a radiation-free background (``Omega_r = 0``).
        T_cmb: CMB temperature today [K] (static): the photon density and the EH fit.
        N_eff: effective number of massless neutrino species (static).
    """

    Omega_c: float
    Omega_b: float
    h: float
    n_s: float
    sigma8: float
    w0: float = -1.0
    wa: float = 0.0
    radiation: bool = field(default=True, metadata={"static": True})
    T_cmb: float = field(default=T_CMB, metadata={"static": True})
    N_eff: float = field(default=N_EFF, metadata={"static": True})

    @property
    def Omega_m(self):
        """Total matter density today, Omega_c + Omega_b."""
        return self.Omega_c + self.Omega_b

    @property
    def Omega_r(self):
        """Radiation density today: photons at T_cmb and N_eff massless neutrino species
        (0 with ``radiation=False``); ~9.1e-5 for Planck 2018."""
        if not self.radiation:
            return 0.0 * self.h
        omega = OMEGA_G_H2 * (self.T_cmb / T_CMB) ** 4 * (1.0 + self.N_eff * _NU_PER_SPECIES)
        return omega / self.h ** 2

    @property
    def Omega_de(self):
        """Dark-energy density today, 1 - Omega_m - Omega_r (flat)."""
        return 1.0 - self.Omega_m - self.Omega_r

    def replace(self, **kwargs) -> "Cosmology":
        """A copy with the given fields replaced."""
        return dataclasses.replace(self, **kwargs)

    def validate(self) -> "Cosmology":
        """Check concrete (non-traced) values; raise ``ValueError`` naming the bad field.

        Valid ranges: Omega_c, Omega_b in (0, 1) with Omega_c + Omega_b < 1, h in (0.2, 2),
        n_s in (0.5, 1.5), sigma8 in (0, 3), w0 in (-3, 0), wa in (-3, 3) and
        w0 + wa < -1/3 (dark energy must be negligible at a = 1e-3, where the growth ODE
        starts).  Array-valued (batched) fields are checked element-wise.  Returns self.
        """
        ranges = {"Omega_c": (0.0, 1.0), "Omega_b": (0.0, 1.0), "h": (0.2, 2.0),
                  "n_s": (0.5, 1.5), "sigma8": (0.0, 3.0), "w0": (-3.0, 0.0), "wa": (-3.0, 3.0)}
        for name, (lo, hi) in ranges.items():
            v = np.asarray(getattr(self, name), dtype=float)
            if not np.all(np.isfinite(v)):
                raise ValueError(f"{name} must be finite, got {getattr(self, name)}")
            if not np.all((v > lo) & (v < hi)):
                raise ValueError(f"{name} must be in ({lo:g}, {hi:g}), got {getattr(self, name)}")
        if not (math.isfinite(self.T_cmb) and 0.0 < self.T_cmb < 10.0):
            raise ValueError(f"T_cmb must be in (0, 10) K, got {self.T_cmb}")
        if not (math.isfinite(self.N_eff) and 0.0 <= self.N_eff < 10.0):
            raise ValueError(f"N_eff must be in [0, 10), got {self.N_eff}")
        om = np.asarray(self.Omega_c, dtype=float) + np.asarray(self.Omega_b, dtype=float)
        if not np.all(om < 1.0):
            raise ValueError(f"Omega_c + Omega_b must be < 1 (flat, Omega_de > 0), got {om}")
        wsum = np.asarray(self.w0, dtype=float) + np.asarray(self.wa, dtype=float)
        if not np.all(wsum < -1.0 / 3.0):
            raise ValueError(f"w0 + wa must be < -1/3 (no early dark energy), got {wsum}")
        return self


def planck18() -> Cosmology:
    """Planck 2018 TT,TE,EE+lowE+lensing+BAO (Planck Collaboration 2020, A&A 641, A6, Table 2,
    last column): Omega_c = 0.11933/h^2, Omega_b = 0.02242/h^2, h = 0.6766, n_s = 0.9665,
    sigma8 = 0.8102, w = -1.  Planck's 0.06 eV neutrino density (~0.0014) is left out, so
    Omega_m = 0.3097 here rather than 0.3111."""
    return Cosmology(Omega_c=0.2607, Omega_b=0.0490, h=0.6766, n_s=0.9665, sigma8=0.8102)


# ----------------------------------------------------------------------------- helpers

def _dtype(cosmo, *xs):
    dt = jnp.result_type(*jax.tree_util.tree_leaves(cosmo), *xs)
    return dt if jnp.issubdtype(dt, jnp.floating) else jnp.result_type(float)


def _cast(cosmo, *xs):
    """Cast the parameters and the inputs ``xs`` to one common floating dtype."""
    dt = _dtype(cosmo, *xs)
    p = jax.tree_util.tree_map(lambda v: jnp.asarray(v, dt), cosmo)
    return (p,) + tuple(jnp.asarray(x, dt) for x in xs)


def _rho_de(p: Cosmology, a):
    """rho_de(a) / rho_de(1) = a^{-3(1 + w0 + wa)} exp(-3 wa (1 - a))."""
    return jnp.exp(-3.0 * (1.0 + p.w0 + p.wa) * jnp.log(a) - 3.0 * p.wa * (1.0 - a))


def _E2_dlnE(p: Cosmology, a):
    """E(a)^2 = (H/H0)^2 and dlnE/dlna for flat w0waCDM with radiation."""
    rho_de = _rho_de(p, a)
    w = p.w0 + p.wa * (1.0 - a)
    r = p.Omega_r * a ** -4
    m = p.Omega_m * a ** -3
    d = p.Omega_de * rho_de
    e2 = r + m + d
    return e2, -(2.0 * r + 1.5 * m + 1.5 * (1.0 + w) * d) / e2


def _a_eq(p: Cosmology):
    """Matter-radiation equality, Omega_r / Omega_m (0 without radiation)."""
    return p.Omega_r / p.Omega_m


def E(cosmo: Cosmology, a):
    """Dimensionless Hubble rate E(a) = H(a)/H0 =
    sqrt(Omega_r a^-4 + Omega_m a^-3 + Omega_de rho_de(a))."""
    p, a = _cast(cosmo, a)
    return jnp.sqrt(_E2_dlnE(p, a)[0])


def _rhs(p: Cosmology, y, s):
    """d/dlna of the growth state s = (D1, D1', D2, D2') with ' = d/dlna."""
    a = jnp.exp(y)
    e2, dlne = _E2_dlnE(p, a)
    om = p.Omega_m / (a ** 3 * e2)  # Omega_m(a)
    fric = 2.0 + dlne
    d1, d1p, d2, d2p = s[..., 0], s[..., 1], s[..., 2], s[..., 3]
    return jnp.stack([d1p, -fric * d1p + 1.5 * om * d1,
                      d2p, -fric * d2p + 1.5 * om * (d2 - d1 ** 2)], axis=-1)


def _dchi_dlna(p: Cosmology, y):
    """-dchi/dlna / (c/H0) = 1 / (a E(a))."""
    a = jnp.exp(y)
    return 1.0 / (a * jnp.sqrt(_E2_dlnE(p, a)[0]))


class GrowthTable(NamedTuple):
    """Tabulated growth and distance solution on the uniform ln a grid (a pytree).

    Each (N, 2) field holds a quantity and its derivative with respect to ln a at the nodes,
    as needed by the cubic Hermite interpolation.  Build it once with :func:`growth_table`
    and pass it as ``table=`` to the growth/distance functions to avoid re-solving the ODE
    when many of them are evaluated in one jitted computation (e.g. FastPM step factors).
    """

    lna: jax.Array  # (N,) ln a nodes, uniform, from ln(1e-3) to ~ln(1.24); node 256 is a = 1
    d1: jax.Array  # D1 and dD1/dlna, normalised to D1(1) = 1
    d1p: jax.Array  # dD1/dlna and d2D1/dlna2
    d2: jax.Array  # D2 and dD2/dlna (D2 normalised by the same D1(1)^2)
    d2p: jax.Array  # dD2/dlna and d2D2/dlna2
    chi: jax.Array  # chi / (c/H0) (0 at a = 1) and dchi/dlna / (c/H0) = -1 / (a E)


def _d1_start(p: Cosmology, a):
    """D1 and dD1/dlna of the growing mode of matter + radiation (Meszaros), a + (2/3) a_eq:
    exact while dark energy is negligible; D1 = a without radiation."""
    return a + 2.0 / 3.0 * _a_eq(p), a


def _d2_start(p: Cosmology, a):
    """D2 and dD2/dlna at the table's start: the series in y = a / a_eq of the second-order
    solution of matter + radiation that vanishes as a -> 0 (the primordial field has no
    second-order part): -(2/3) a_eq a - a^2 / 2 + a^3 / (36 a_eq) + O(y^4), for y < 0.3 (the
    series converges for y < 1); beyond, and without radiation, the matter era's -(3/7) a^2."""
    aeq = _a_eq(p)
    safe = jnp.maximum(aeq, a)  # the series is used only where a < 0.3 a_eq
    d2 = -2.0 / 3.0 * aeq * a - 0.5 * a ** 2 + a ** 3 / (36.0 * safe)
    d2p = -2.0 / 3.0 * aeq * a - a ** 2 + a ** 3 / (12.0 * safe)
    rad = a < 0.3 * aeq
    return jnp.where(rad, d2, -3.0 / 7.0 * a ** 2), jnp.where(rad, d2p, -6.0 / 7.0 * a ** 2)


@jax.jit
def _solve(p: Cosmology) -> GrowthTable:
    # jitted: its RK4 scan and Simpson sums are traced once per process and dtype, not at every
    # growth factor, distance and power spectrum of every trace (a forward asks for ~6 tables,
    # and tracing one, with its derivative in Omega_c, took ~0.5 s); inside an outer jit it is
    # inlined, so what runs is unchanged
    dt = p.Omega_c.dtype
    dy = jnp.asarray(_DY, dt)
    ys = math.log(_A_MIN) + _DY * jnp.arange(_N_TO_ONE + _N_EXTRA + 1, dtype=dt)
    a0 = jnp.asarray(_A_MIN, dt)
    s0 = jnp.stack([*_d1_start(p, a0), *_d2_start(p, a0)])

    def step(s, y):  # classical RK4 in ln a
        k1 = _rhs(p, y, s)
        k2 = _rhs(p, y + 0.5 * dy, s + 0.5 * dy * k1)
        k3 = _rhs(p, y + 0.5 * dy, s + 0.5 * dy * k2)
        k4 = _rhs(p, y + dy, s + dy * k3)
        s = s + dy / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        return s, s

    _, ss = jax.lax.scan(step, s0, ys[:-1])
    ss = jnp.concatenate([s0[None], ss], axis=0)
    ds = _rhs(p, ys, ss)  # exact ln a derivatives at the nodes, from the ODE
    n1 = ss[_N_TO_ONE, 0]  # D1(a=1) before normalisation
    col = lambda i, c: jnp.stack([ss[:, i], ds[:, i]], axis=-1) / c
    # chi: Simpson's rule per interval, summed outwards from a = 1 (no cancellation near a = 1)
    g = _dchi_dlna(p, ys)
    inc = dy / 6.0 * (g[:-1] + 4.0 * _dchi_dlna(p, ys[:-1] + 0.5 * dy) + g[1:])
    before = jnp.arange(inc.shape[0]) < _N_TO_ONE
    zero = jnp.zeros((1,), dt)
    chi = (jnp.concatenate([jnp.cumsum(jnp.where(before, inc, 0.0)[::-1])[::-1], zero])
           - jnp.concatenate([zero, jnp.cumsum(jnp.where(before, 0.0, inc))]))
    return GrowthTable(ys, col(0, n1), col(1, n1), col(2, n1 ** 2), col(3, n1 ** 2),
                       jnp.stack([chi, -g], axis=-1))


def growth_table(cosmo: Cosmology) -> GrowthTable:
    """Solve the growth ODEs and the distance integral once (see :class:`GrowthTable`)."""
    return _solve(_cast(cosmo)[0])


def _setup(cosmo, x, table):
    p, x = _cast(cosmo, x)
    return p, x, (_solve(p) if table is None else table)


def _hermite(x, xp, fm, uniform=False):
    """Cubic Hermite interpolation at x (clamped to [xp[0], xp[-1]]) of nodes xp (increasing)
    carrying values fm[:, 0] and derivatives fm[:, 1].  ``uniform``: xp is the ln a grid
    ln(_A_MIN) + i * _DY, whose exact spacing avoids float32 rounding of node differences."""
    x = jnp.clip(x, xp[0], xp[-1])
    if uniform:  # counted from the node a = 1, so that a = 1 falls on it exactly in float32
        u = _N_TO_ONE + x / _DY
        i = jnp.clip(jnp.floor(u).astype(jnp.int32), 0, xp.shape[0] - 2)
        h, t = _DY, u - i
    else:
        i = jnp.clip(jnp.searchsorted(xp, x, side="right") - 1, 0, xp.shape[0] - 2)
        h = xp[i + 1] - xp[i]
        t = (x - xp[i]) / h
    t2, t3 = t * t, t * t * t
    return ((2 * t3 - 3 * t2 + 1) * fm[i, 0] + (t3 - 2 * t2 + t) * h * fm[i, 1]
            + (3 * t2 - 2 * t3) * fm[i + 1, 0] + (t3 - t2) * h * fm[i + 1, 1])


def _interp(tab: GrowthTable, which: str, a, power: float = 0.0):
    """Interpolate a table column at a; below the table (a = 1e-5) scale as a**power (the
    matter era's power laws; fli never asks so early, see :func:`growth_factor` for D1)."""
    y = jnp.log(a)
    val = _hermite(y, tab.lna, getattr(tab, which), uniform=True)
    if power:
        val = val * jnp.exp(power * jnp.minimum(y - tab.lna[0], 0.0))
    return val


# ---------------------------------------------------------------------- distances
# Every function below takes an optional ``table=growth_table(cosmo)`` to reuse one solve.

def comoving_distance(cosmo: Cosmology, a, table: GrowthTable | None = None):
    """Comoving distance chi(a) = (c/H0) int_a^1 da' / (a'^2 E(a')) in Mpc/h (0 at a = 1,
    negative for a > 1).  Below a = 1e-5 the matter + radiation closed form is used,
    int da / sqrt(Omega_r + Omega_m a) = (2 / Omega_m) [sqrt(Omega_r + Omega_m a)]."""
    p, a, tab = _setup(cosmo, a, table)
    chi = _interp(tab, "chi", a)
    amin = jnp.asarray(_A_MIN, a.dtype)
    early = 2.0 / p.Omega_m * (jnp.sqrt(p.Omega_r + p.Omega_m * amin)
                               - jnp.sqrt(p.Omega_r + p.Omega_m * jnp.minimum(a, amin)))
    return C_OVER_H0 * (chi + early)


def a_of_chi(cosmo: Cosmology, chi, table: GrowthTable | None = None):
    """Scale factor at comoving distance chi [Mpc/h]: the inverse of :func:`comoving_distance`,
    by cubic Hermite interpolation of ln a in chi (slope dlna/dchi = -a E H0/c).  Beyond
    a = 1e-5 the matter + radiation closed form is inverted; beyond the particle horizon
    it returns 0."""
    p, chi, tab = _setup(cosmo, chi, table)
    xc = tab.chi[::-1, 0] * C_OVER_H0  # increasing
    fm = jnp.stack([tab.lna[::-1], 1.0 / (tab.chi[::-1, 1] * C_OVER_H0)], axis=-1)
    a = jnp.exp(_hermite(chi, xc, fm))
    # chi = chi(a_min) + 2 (c/H0) (sqrt(Or + Om a_min) - sqrt(Or + Om a)) / Om for a < a_min
    excess = jnp.maximum(chi - xc[-1], 0.0) * p.Omega_m / (2.0 * C_OVER_H0)
    root = jnp.maximum(jnp.sqrt(p.Omega_r + p.Omega_m * _A_MIN) - excess, jnp.sqrt(p.Omega_r))
    return jnp.where(chi > xc[-1], (root ** 2 - p.Omega_r) / p.Omega_m, a)


# -------------------------------------------------------------------------- growth

def growth_factor(cosmo: Cosmology, a, table: GrowthTable | None = None):
    """Linear growth factor D1(a), normalised to D1(1) = 1 (D1 ~ a in matter domination;
    below the table, the matter + radiation growing mode a + (2/3) a_eq)."""
    p, a, tab = _setup(cosmo, a, table)
    return _d1(p, tab, a)


def _d1(p: Cosmology, tab: GrowthTable, a):
    """D1 from the table; below it, scaled as the growing mode a + (2/3) a_eq (exact for
    matter + radiation)."""
    val = _interp(tab, "d1", a)
    aeq, amin = _a_eq(p), jnp.asarray(_A_MIN, a.dtype)
    return val * jnp.where(a < amin, (a + 2.0 / 3.0 * aeq) / (amin + 2.0 / 3.0 * aeq), 1.0)


def growth_rate(cosmo: Cosmology, a, table: GrowthTable | None = None):
    """Linear growth rate f1(a) = dlnD1/dlna."""
    p, a, tab = _setup(cosmo, a, table)
    return _interp(tab, "d1p", a, 1.0) / _d1(p, tab, a)


def growth_factor_derivative(cosmo: Cosmology, a, table: GrowthTable | None = None):
    """dD1/da = f1 D1 / a (the FastPM drift factor g_p of Feng et al. 2016)."""
    p, a, tab = _setup(cosmo, a, table)
    return _interp(tab, "d1p", a, 1.0) / a


def growth_factor_second(cosmo: Cosmology, a, table: GrowthTable | None = None):
    """Second-order (2LPT) growth factor D2(a), with D2 -> -(3/7) D1^2 at early times
    (so D2 < 0; 2LPT displacement Psi = -D1 grad(phi1) + D2 grad(phi2), see module doc).
    Solves D2'' + (2 + dlnE/dlna) D2' - 1.5 Omega_m(a) D2 = -1.5 Omega_m(a) D1^2."""
    p, a, tab = _setup(cosmo, a, table)
    return _interp(tab, "d2", a, 2.0)


def growth_rate_second(cosmo: Cosmology, a, table: GrowthTable | None = None):
    """Second-order growth rate f2(a) = dlnD2/dlna (-> 2 in matter domination)."""
    p, a, tab = _setup(cosmo, a, table)
    return _interp(tab, "d2p", a, 2.0) / _interp(tab, "d2", a, 2.0)


def growth_factor_second_derivative(cosmo: Cosmology, a, table: GrowthTable | None = None):
    """dD2/da = f2 D2 / a (first derivative of the second-order growth factor)."""
    p, a, tab = _setup(cosmo, a, table)
    return _interp(tab, "d2p", a, 2.0) / a


def growth_Gf(cosmo: Cosmology, a, table: GrowthTable | None = None):
    """FastPM kick function G_f(a) = a^3 E(a) dD1/da  (Feng et al. 2016, arXiv:1603.00476)."""
    p, a, tab = _setup(cosmo, a, table)
    return a ** 2 * jnp.sqrt(_E2_dlnE(p, a)[0]) * _interp(tab, "d1p", a, 1.0)


def growth_gf(cosmo: Cosmology, a, table: GrowthTable | None = None):
    """g_f(a) = dG_f/da = 1.5 Omega_m D1(a) / (a^2 E(a)), exact by the growth ODE
    d/da (a^3 E dD1/da) = 1.5 Omega_m D1 / (a^2 E)."""
    p, a, tab = _setup(cosmo, a, table)
    return 1.5 * p.Omega_m * _d1(p, tab, a) / (a ** 2 * jnp.sqrt(_E2_dlnE(p, a)[0]))


def growth_Gf2(cosmo: Cosmology, a, table: GrowthTable | None = None):
    """Second-order kick function G_f2(a) = a^3 E(a) dD2/da (D2 in this module's convention)."""
    p, a, tab = _setup(cosmo, a, table)
    return a ** 2 * jnp.sqrt(_E2_dlnE(p, a)[0]) * _interp(tab, "d2p", a, 2.0)


def growth_gf2(cosmo: Cosmology, a, table: GrowthTable | None = None):
    """g_f2(a) = dG_f2/da = 1.5 Omega_m (D2 - D1^2) / (a^2 E), exact by the D2 ODE."""
    p, a, tab = _setup(cosmo, a, table)
    d1, d2 = _d1(p, tab, a), _interp(tab, "d2", a, 2.0)
    return 1.5 * p.Omega_m * (d2 - d1 ** 2) / (a ** 2 * jnp.sqrt(_E2_dlnE(p, a)[0]))
