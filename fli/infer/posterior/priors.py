"""Priors of the cosmological parameters as transforms of standard-normal latents.

Every latent of the model is a priori N(0, 1): the field is white noise by construction and
each sampled cosmological parameter is ``theta = T(z)`` with ``z ~ N(0, 1)`` and ``T`` the
map that carries the standard normal onto the parameter's prior (its quantile function
composed with the normal CDF Phi):

* uniform on [low, high]:             ``T(z) = low + (high - low) Phi(z)``;
* normal (loc, scale):                ``T(z) = loc + scale z``;
* truncated normal on [low, high]:    ``T(z) = loc + scale Phi^-1(Phi(a) + Phi(z) (Phi(b) - Phi(a)))``
  with ``a, b = (low - loc) / scale, (high - loc) / scale``.

So the posterior in the latents is ``N(z; 0, I) x likelihood(T(z), s)``: one flat vector of
standard normals for the sampler (and standardised coordinates for the optimiser), and no
Jacobian term to carry.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtr, ndtri

from fli.config import ConfigError, PriorConfig
from fli.sim.host import cpu_float64


@dataclasses.dataclass(frozen=True)
class PriorTransform:
    """The sampled parameters, in order, and their priors (static, hashable).

    Attributes:
        names: sampled parameter names (``prior.sample`` order).
        dists: ``"uniform" | "normal" | "truncated_normal"`` per parameter.
        low, high, loc, scale: the prior's numbers per parameter (unused ones ignored).
    """

    names: tuple[str, ...]
    dists: tuple[str, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    loc: tuple[float, ...]
    scale: tuple[float, ...]

    @classmethod
    def from_config(cls, prior: PriorConfig) -> "PriorTransform":
        ps = [prior.params[n] for n in prior.sample]
        return cls(tuple(prior.sample), tuple(p.dist for p in ps), tuple(float(p.low) for p in ps),
                   tuple(float(p.high) for p in ps), tuple(float(p.loc) for p in ps),
                   tuple(float(p.scale) for p in ps))

    @property
    def n(self) -> int:
        return len(self.names)

    def _one(self, i: int, z):
        d, lo, hi, mu, sd = self.dists[i], self.low[i], self.high[i], self.loc[i], self.scale[i]
        if d == "uniform":
            return lo + (hi - lo) * ndtr(z)
        if d == "normal":
            return mu + sd * z
        pa, pb = ndtr((lo - mu) / sd), ndtr((hi - mu) / sd)
        return mu + sd * ndtri(pa + ndtr(z) * (pb - pa))

    def _one_inv(self, i: int, x):
        d, lo, hi, mu, sd = self.dists[i], self.low[i], self.high[i], self.loc[i], self.scale[i]
        if d == "uniform":
            return ndtri((x - lo) / (hi - lo))
        if d == "normal":
            return (x - mu) / sd
        pa, pb = ndtr((lo - mu) / sd), ndtr((hi - mu) / sd)
        return ndtri((ndtr((x - mu) / sd) - pa) / (pb - pa))

    def __call__(self, z):
        """Physical parameters ``[n]`` from standard-normal latents ``z`` ``[n]`` (traceable)."""
        if self.n == 0:
            return jnp.zeros((0,), jnp.result_type(z))
        return jnp.stack([self._one(i, z[i]) for i in range(self.n)])

    def inverse(self, theta) -> np.ndarray:
        """Latents ``[n]`` of physical values ``theta`` (host); outside the support -> ConfigError."""
        theta = np.asarray(theta, float)
        for i, name in enumerate(self.names):
            if self.dists[i] != "normal" and not self.low[i] < theta[i] < self.high[i]:
                raise ConfigError(f"{name} = {theta[i]:g} lies outside its prior "
                                  f"[{self.low[i]:g}, {self.high[i]:g}] (prior.params.{name})")
        with cpu_float64():
            return np.asarray([float(self._one_inv(i, jnp.float64(theta[i]))) for i in range(self.n)])

    def jacobian(self, z) -> jax.Array:
        """Diagonal ``d theta_i / d z_i`` ``[n]`` at ``z`` (the priors are independent)."""
        return jnp.stack([jax.grad(lambda t, i=i: self._one(i, t))(z[i]) for i in range(self.n)]) \
            if self.n else jnp.zeros((0,))

    def sample(self, key, shape=()) -> jax.Array:
        """Draws of the physical parameters ``[*shape, n]`` from the prior."""
        z = jax.random.normal(key, (*shape, self.n))
        return jnp.moveaxis(jnp.stack([self._one(i, z[..., i]) for i in range(self.n)]), 0, -1)


def _cov_root(cov_z) -> np.ndarray:
    """``R`` with ``R R^T = cov_z`` (symmetrised; negative eigenvalues of round-off clipped)."""
    cov_z = np.asarray(cov_z, np.float64)
    w_eig, v = np.linalg.eigh(0.5 * (cov_z + cov_z.T))
    return v * np.sqrt(np.clip(w_eig, 0.0, None))


PUSHFORWARD_POINTS = 20_000  # the most points the pushforward's quadrature evaluates


def gaussian_pushforward(mean_z, cov_z, fn, max_points: int = PUSHFORWARD_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Mean ``[m]`` and covariance ``[m, m]`` of ``fn(z)`` for ``z ~ N(mean_z, cov_z)`` (host, float64).

    ``fn`` maps a batch of latents ``[N, n]`` to values ``[N, m]`` (e.g. the prior transform and
    the derived parameters). A Gaussian in the standardised latents is not Gaussian in the
    physical parameters: near a bounded prior's edge, or where the latent width is comparable to
    the prior's, the delta method ``J cov_z J^T`` misstates the width (a latent N(0, 1) through a
    uniform prior gives the delta method 1.38x the uniform's sd). The moments here are those of
    the pushforward itself.

    Quadrature: Gauss-Hermite's product rule with ``k`` nodes per axis, ``k`` the largest with
    ``k^n <= max_points``, at most 64 (exact for polynomials of degree ``2k - 1``; k = 64 for
    n = 2, 27 for n = 3, 11 for n = 4); where that leaves ``k < 8``, ``max_points`` draws of a fixed seed
    (relative Monte Carlo error of a variance ``sqrt(2 / max_points)``, 1 % at the default).
    """
    mean_z, root = np.asarray(mean_z, np.float64), _cov_root(cov_z)
    n = mean_z.shape[0]
    k = min(64, int(math.floor(max_points ** (1.0 / n) + 1e-9))) if n else 1
    if k >= 8:
        x, w = np.polynomial.hermite_e.hermegauss(k)
        grid = np.stack(np.meshgrid(*([x] * n), indexing="ij"), -1).reshape(-1, n)
        weights = np.prod(np.stack(np.meshgrid(*([w / w.sum()] * n), indexing="ij"), -1).reshape(-1, n), axis=1)
    else:
        grid = np.random.default_rng(0).standard_normal((max_points, n))
        weights = np.full(max_points, 1.0 / max_points)
    vals = np.asarray(fn(mean_z + grid @ root.T), np.float64)
    mean = weights @ vals
    dev = vals - mean
    return mean, (dev * weights[:, None]).T @ dev


PUSHFORWARD_DRAWS = 200_000  # the draws behind a pushforward's quantiles (gaussian_quantiles)


def gaussian_quantiles(mean_z, cov_z, fn, q, n_draws: int = PUSHFORWARD_DRAWS, seed: int = 0) -> np.ndarray:
    """Quantiles ``q`` ``[k]`` of each component of ``fn(z)`` for ``z ~ N(mean_z, cov_z)``:
    ``[k, m]`` (host, float64), from ``n_draws`` draws of a fixed seed.

    For a component that is a monotone function of one latent (a sampled parameter through its
    prior) the quantiles follow in closed form from that latent's; this is for those that are
    not (Omega_m, S8 through several latents). The Monte Carlo error of a central 68 %
    interval's end with the default draws: ``sqrt(0.16 x 0.84 / 200000) / phi(1)``, 0.0036 of
    the component's sd for a Gaussian one.
    """
    mean_z, root = np.asarray(mean_z, np.float64), _cov_root(cov_z)
    eps = np.random.default_rng(seed).standard_normal((n_draws, mean_z.shape[0]))
    vals = np.asarray(fn(mean_z + eps @ root.T), np.float64)
    return np.quantile(vals, np.asarray(q, np.float64), axis=0)
