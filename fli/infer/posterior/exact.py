r"""The exact posterior of the cosmological parameters under the linear forward.

With ``simulation.forward=linear`` the convergence is linear in the white noise, so the whitened
residual (``Posterior.residual``) is affine in ``s``: ``r(theta, s) = A(theta) s - b`` with
``A = W K(theta)`` (``W = mask / sigma_b``, ``K`` the linear forward) and ``b = W d``. The field
integrates out of ``exp(-|r|^2 / 2 - |s|^2 / 2)`` in closed form:
``p(theta_z | d) propto N(theta_z; 0, I) N(b; 0, C(theta))``, ``C = I + A A^T``, an ``m x m``
Gaussian over the ``m`` unmasked pixels of all bins (a masked pixel's row of ``A`` and entry of
``b`` are 0). On a grid of ``theta_z`` the log posterior is exact up to float32 rounding of ``A``
and float64 rounding of ``C``'s Cholesky factor, with no sampler and no optimiser: it is the
reference that the samplers, MUSE and the validation report are held against on the linear forward.

``A``'s rows are the residual's vector-Jacobian products in ``s`` (``jax.jacrev``, taken at
``s = 0``, where ``r = -b``). The field is gathered, so this is for small configurations whose
``m x n`` floats fit in memory (tiny: 512 x 16384, 34 MB in float32); :func:`response` refuses
larger ones, naming the size.

Entry points: :func:`log_evidence`, :func:`log_posterior`, :func:`grid_posterior` (a
:class:`GridPosterior`, whose :meth:`~GridPosterior.moments` give means and sds of the physical
parameters, S8 and Omega_m included).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from fli.infer.posterior.model import Data, Latents, Posterior

# the largest A (m x n float32) that :func:`response` builds: a reference, not a production path
MAX_RESPONSE_BYTES = 2 * 1024 ** 3


def _check_linear(post: Posterior) -> None:
    if post.fwd.kind != "linear":
        raise ValueError(f"the exact posterior needs simulation.forward=linear (kappa linear in the white noise); "
                         f"this posterior's forward is {post.fwd.kind!r}")


def _response_fn(post: Posterior, data: Data):
    """jitted theta_z -> (A [m_all, n], r(theta, 0) [m_all]) over every pixel of every bin."""
    shape = post.fwd.grid.shape

    def res(theta, s):
        return post.residual(Latents(theta, s), data).reshape(-1)

    def both(theta):
        zero = jnp.zeros(shape, post.fwd.grid.jdtype)
        jac = jax.jacrev(res, argnums=1)(theta, zero)
        return jac.reshape(jac.shape[0], -1), res(theta, zero)

    return jax.jit(both)


def response(post: Posterior, data: Data, theta_z) -> tuple[np.ndarray, np.ndarray]:
    """``(A, b)`` at ``theta_z`` on the unmasked pixels (with ``lensing.ell_max``, the kept
    whitened Fourier components): ``A`` ``[m, n]`` (float32) and ``b = W d`` ``[m]``, so that
    the residual is ``A s - b``."""
    return _Response(post, data)(theta_z)


class _Response:
    """The compiled response of one posterior and data, reused over a grid of theta."""

    def __init__(self, post: Posterior, data: Data):
        _check_linear(post)
        if data.modes is not None:  # the scale cut: its whitened components, less the zero padding rows
            self.keep = np.asarray(jax.device_get(jnp.any(data.modes != 0, axis=(2, 3)))).reshape(-1)
        else:
            self.keep = np.asarray(jax.device_get(data.weight)).reshape(-1) > 0
        m_all = int(self.keep.size)
        n = post.fwd.grid.n_cells
        need = m_all * n * np.dtype(post.fwd.grid.dtype).itemsize
        if need > MAX_RESPONSE_BYTES:
            raise ValueError(f"the exact posterior's response matrix would take {need / 1024 ** 3:.1f} GiB "
                             f"({m_all} pixels x {n} cells); it is for configs up to "
                             f"{MAX_RESPONSE_BYTES / 1024 ** 3:.0f} GiB (lensing.npix, simulation.mesh)")
        self.fn = _response_fn(post, data)
        self.dtype = post.fwd.grid.jdtype

    def __call__(self, theta_z):
        a, r0 = self.fn(jnp.asarray(theta_z, self.dtype))
        a, r0 = np.asarray(jax.device_get(a)), np.asarray(jax.device_get(r0))
        return a[self.keep], -r0[self.keep]


def _gaussian_logpdf(a: np.ndarray, b: np.ndarray) -> float:
    """log N(b; 0, I + A A^T) in float64 (Cholesky; C's eigenvalues are >= 1)."""
    a = a.astype(np.float64)
    c = a @ a.T
    c[np.diag_indices_from(c)] += 1.0
    chol = np.linalg.cholesky(c)
    y = np.linalg.solve(chol, b.astype(np.float64))  # triangular, as a general solve: m is small
    return float(-0.5 * y @ y - np.log(np.diag(chol)).sum() - 0.5 * b.size * math.log(2 * math.pi))


def log_evidence(post: Posterior, data: Data, theta_z) -> float:
    """``log p(d | theta)`` of the whitened unmasked data, ``log N(b; 0, I + A A^T)``: the
    field integrated out exactly."""
    return _gaussian_logpdf(*response(post, data, theta_z))


def log_posterior(post: Posterior, data: Data, theta_z) -> float:
    """``log p(theta_z | d)`` up to a constant: the standard-normal prior of the latents plus
    :func:`log_evidence`."""
    z = np.asarray(theta_z, np.float64)
    return float(-0.5 * z @ z - 0.5 * z.size * math.log(2 * math.pi)) + log_evidence(post, data, theta_z)


@dataclasses.dataclass(frozen=True)
class GridPosterior:
    """The exact log posterior on a regular grid of the standardised latents.

    Attributes:
        names: the sampled parameters, in ``post.names`` order.
        axes: one 1D grid of ``theta_z`` per parameter.
        log_p: ``[len(axes[0]), len(axes[1]), ...]`` the normalised log posterior mass of each
            grid cell (``logsumexp(log_p) = 0``).
        physical: the physical parameters (sampled and derived: Omega_m, S8) at every grid
            point, each an array of ``log_p``'s shape.
    """

    names: tuple[str, ...]
    axes: tuple[np.ndarray, ...]
    log_p: np.ndarray
    physical: dict[str, np.ndarray]

    @property
    def weights(self) -> np.ndarray:
        return np.exp(self.log_p)

    def edge_mass(self) -> float:
        """Posterior mass on the grid's outer cells: large if the grid cuts the posterior off."""
        inner = np.ones(self.log_p.shape, bool)
        inner[tuple(slice(1, -1) for _ in self.log_p.shape)] = False
        return float(self.weights[inner].sum())

    def moments(self) -> dict[str, dict[str, float]]:
        """``{name: {"mean": ..., "sd": ...}}`` of every physical parameter under the grid's
        posterior (a sum over cells: the grid's spacing sets the accuracy, see
        :func:`grid_posterior`)."""
        w = self.weights
        out = {}
        for name, v in self.physical.items():
            mean = float((w * v).sum())
            out[name] = {"mean": mean, "sd": float(np.sqrt(max((w * (v - mean) ** 2).sum(), 0.0)))}
        return out


def grid_posterior(post: Posterior, data: Data, n: int = 25, span: float = 3.0, center=None,
                   half_width=None, progress=None) -> GridPosterior:
    """The exact posterior of ``theta_z`` on a regular grid of ``n`` points per parameter.

    The grid covers ``center +- half_width`` (per parameter; default: the prior's
    ``0 +- span``). ``n ** n_params`` evaluations, each one batched Jacobian of the
    residual (``m`` VJPs); ``progress(i, total)`` is called after each. Check
    :meth:`GridPosterior.edge_mass` (the mass cut off by the grid's edges) before trusting
    its moments; narrow the grid around a first pass's mean for a resolved posterior.
    """
    if n < 3:
        raise ValueError(f"n must be >= 3 grid points per parameter, got {n}")
    k = post.prior.n
    if k < 1:
        raise ValueError("the posterior samples no parameter (prior.sample=[]): there is no theta to grid")
    center = np.zeros(k) if center is None else np.asarray(center, float)
    half = np.full(k, span) if half_width is None else np.broadcast_to(np.asarray(half_width, float), (k,))
    axes = tuple(np.linspace(c - h, c + h, n) for c, h in zip(center, half, strict=True))
    resp = _Response(post, data)
    log_p = np.empty((n,) * k)
    total = n ** k
    for i, idx in enumerate(itertools.product(range(n), repeat=k)):
        z = np.array([axes[j][idx[j]] for j in range(k)])
        log_p[idx] = -0.5 * z @ z + _gaussian_logpdf(*resp(z))
        if progress is not None:
            progress(i + 1, total)
    log_p -= np.logaddexp.reduce(log_p.ravel())
    grids = np.meshgrid(*axes, indexing="ij")
    flat = np.stack([g.ravel() for g in grids], axis=-1)
    params = jax.vmap(post.params)(jnp.asarray(flat, post.fwd.grid.jdtype))
    physical = {name: np.asarray(v, float).reshape(log_p.shape) for name, v in params.items()}
    return GridPosterior(tuple(post.names), axes, log_p, physical)
