"""The field-level posterior, once: priors, the forward model, the Gaussian likelihood.

Latents, all a priori standard normal (:mod:`fli.infer.posterior.priors`): ``theta`` ``[n]``,
replicated, the sampled cosmological parameters (``prior.sample``) in standardised form,
``theta_phys = T(theta)`` (the others stay at the config's ``cosmology``); and the white noise
``s`` ``[nx, ny, nz]``, sharded ``P('x', 'y')``. The model is non-centred: the forward builds
``delta_L = FFT^-1(sqrt(P(k; theta)) FFT(s))``. The likelihood is Gaussian per pixel of the
observed (sharded) kappa, with each bin's noise ``sigma_b``, masked pixels (``m_p = 0``) left out:
``U(theta, s) = sum_{b,p} m_p (kappa_b(theta, s)_p - d_{b,p})^2 / (2 sigma_b^2) + |theta|^2 / 2 +
|s|^2 / 2``, constants dropped.

:class:`Posterior` gives U on a pytree :class:`Latents` (Optax, the Laplace step) and on one flat
vector sharded over all devices (:mod:`fli.infer.posterior.layout`, NumPyro's samplers);
:meth:`Posterior.numpyro_model` is the same posterior as a NumPyro model, with deterministic
sites for every physical parameter, ``Omega_m`` and ``S8 = sigma8 sqrt(Omega_m / 0.3)``. Its sums
are local plus one scalar all-reduce, never a gather (tests/infer/posterior/test_model.py reads
the compiled HLO). With ``lensing.ell_max`` each bin enters only through its whitened Fourier
components up to that multipole, ``r_b = B_b (kappa_b - d_b)`` (:mod:`fli.infer.posterior.scale_cut`).
Annealing (Modi, Feng & Seljak 2018, arXiv:1805.02247): ``smooth`` [pixels] convolves the whitened
residual with a periodic Gaussian of that width before it is squared, so the optimiser fits the
large scales first; ``smooth = 0`` is the exact likelihood.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fli.config import Config, ConfigError
from fli.cosmo.background import Cosmology
from fli.forward import ForwardModel, build_forward, fiducial_cosmology
from fli.infer.posterior.layout import FlatLayout
from fli.infer.posterior.params import with_derived
from fli.infer.posterior.priors import PriorTransform
from fli.lensing.born import KAPPA_SPEC


class Latents(NamedTuple):
    """theta: ``[n]`` standardised cosmological latents (replicated); s: white noise ``P('x','y')``."""

    theta: Array
    s: Array


class Data(NamedTuple):
    """The observation as the likelihood reads it (pass it as an argument, never close over it).

    kappa_obs: ``[n_bins, npix, npix]`` ``P(None, 'x', 'y')``; weight: same shape and sharding,
    ``mask / sigma_b`` (0 where masked); sigma: ``[n_bins]`` per-pixel noise (replicated);
    modes: None (every pixel), or with ``lensing.ell_max`` the whitened Fourier rows
    ``[n_bins, M, npix, npix]`` ``P(None, None, 'x', 'y')`` (:mod:`fli.infer.posterior.scale_cut`).
    """

    kappa_obs: Array
    weight: Array
    sigma: Array
    modes: Array | None = None


def smoothing_matrix(n: int, width, dtype=jnp.float32) -> Array:
    """``[n, n]`` periodic Gaussian smoothing of width ``width`` [pixels] (traceable).

    ``G = F^-1 diag(exp(-k^2 w^2 / 2)) F`` written as a real circulant matrix,
    ``G_ij = (1/n) sum_k exp(-k^2 w^2 / 2) cos(k (i - j))`` with ``k = 2 pi m / n``; ``w = 0``
    gives the identity. Applied on both map axes (an n^2 matmul: no FFT of a sharded map).
    """
    m = jnp.fft.fftfreq(n, 1.0 / n).astype(dtype)
    k = 2 * jnp.pi * m / n
    filt = jnp.exp(-0.5 * (k * jnp.asarray(width, dtype)) ** 2)
    d = jnp.arange(n, dtype=dtype)
    phase = k[:, None, None] * (d[None, :, None] - d[None, None, :])
    return jnp.sum(filt[:, None, None] * jnp.cos(phase), axis=0) / n


@dataclasses.dataclass(frozen=True, eq=False)
class Posterior:
    """The posterior of one analysis: forward model, priors, fixed parameters, flat layout.

    Attributes:
        fwd: the forward model (:func:`fli.forward.build_forward`).
        prior: the sampled parameters' transforms.
        base: the cosmology whose non-sampled parameters are fixed (host floats).
    """

    fwd: ForwardModel
    prior: PriorTransform
    base: Cosmology
    ell_max: tuple[float, ...] | None = None  # lensing.ell_max, per bin (None: every pixel)

    @property
    def layout(self) -> FlatLayout:
        return FlatLayout(self.fwd.grid.shape, self.fwd.grid.mesh, self.prior.n)

    @property
    def names(self) -> tuple[str, ...]:
        return self.prior.names

    @property
    def dim(self) -> int:
        """Number of latent dimensions: field cells plus sampled parameters."""
        return self.fwd.grid.n_cells + self.prior.n

    # -- parameters -----------------------------------------------------------------------
    def cosmology(self, theta) -> Cosmology:
        """The cosmology at standardised latents ``theta`` ``[n]`` (traceable)."""
        phys = self.prior(theta)
        return self.base.replace(**{n: phys[i] for i, n in enumerate(self.names)})

    def params(self, theta) -> dict[str, Array]:
        """Sampled physical parameters and the derived ``Omega_m`` and ``S8``."""
        c = self.cosmology(theta)
        return with_derived({n: getattr(c, n) for n in self.names}, c)

    def truth_cosmology(self, truth: dict[str, float]) -> Cosmology:
        """The cosmology of a mock's truth: its values where given, this posterior's fixed
        values elsewhere."""
        return self.base.replace(**{k: float(v) for k, v in truth.items() if hasattr(self.base, k)})

    def theta_of(self, values: dict[str, float]) -> np.ndarray:
        """Standardised latents of physical values (host), e.g. a mock's truth."""
        return self.prior.inverse([values[n] for n in self.names])

    # -- model ----------------------------------------------------------------------------
    def predict(self, lat: Latents, **kw):
        """Noiseless kappa ``[n_bins, npix, npix]`` and the forward's diagnostics."""
        return self.fwd(self.cosmology(lat.theta), lat.s, **kw)

    def residual(self, lat: Latents, data: Data, smooth=None) -> Array:
        """Whitened residual ``mask (kappa - d) / sigma_b`` ``P(None, 'x', 'y')``, optionally
        smoothed by a Gaussian of ``smooth`` pixels (:func:`smoothing_matrix`); with a scale
        cut (``data.modes``), the whitened Fourier components ``[n_bins, M]`` (replicated) of
        the residual, smoothed before it is projected."""
        kappa, _ = self.predict(lat)
        return self._whiten(kappa, data, smooth)

    def _whiten(self, kappa, data: Data, smooth):
        cut = data.modes is not None
        r = kappa - data.kappa_obs if cut else (kappa - data.kappa_obs) * data.weight
        if smooth is not None:
            g = smoothing_matrix(r.shape[-1], smooth, r.dtype)
            rs = jnp.einsum("ij,bjk,lk->bil", g, r, g)
            r = jnp.where(jnp.asarray(smooth) > 0, rs, r)
        if cut:  # local products over each device's pixels, one all-reduce of [n_bins, M]
            return jnp.einsum("bmij,bij->bm", data.modes.astype(r.dtype), r)
        return jax.lax.with_sharding_constraint(r, NamedSharding(self.fwd.grid.mesh, KAPPA_SPEC))

    @property
    def n_terms(self) -> int:
        """The likelihood's terms: the map's pixels, or with a scale cut its kept Fourier
        components (without a mask)."""
        if self.ell_max is None:
            return math.prod(self.fwd.kappa_shape)
        from fli.infer.posterior.scale_cut import n_modes  # noqa: PLC0415

        g = self.fwd.geometry
        return n_modes(g.npix, g.fov_deg, self.ell_max)

    @property
    def energy_offset(self) -> float:
        """The constant that ``precise=True`` subtracts from U: the expected 0.5 |s|^2 plus
        the expected likelihood term, 0.5 (cells + the likelihood's terms)."""
        return 0.5 * (self.fwd.grid.n_cells + self.n_terms)

    def potential_and_aux(self, lat: Latents, data: Data, smooth=None, precise: bool = False):
        """``(U, aux)``: the negative log posterior (constants dropped) and the forward's
        diagnostics (``max_disp``, ``chi2`` of the unsmoothed residual over the pixels; with a
        scale cut also ``chi2_cut``, that of the kept Fourier components (smoothed where
        ``smooth`` is), and ``n_cut``, their number under the mask).

        ``precise``: return ``U - energy_offset`` with the field's and the map's sums taken
        in float64 (:mod:`fli.infer.posterior.energy`), so that a float32 U resolves changes of 1e-4
        at any D; samplers use it, the gradient is the same.
        """
        kappa, aux = self.predict(lat)
        r = self._whiten(kappa, data, smooth)
        theta2 = 0.5 * jnp.sum(lat.theta * lat.theta)
        if precise:
            from fli.infer.posterior.energy import offset_sum  # noqa: PLC0415

            like = offset_sum(0.5 * r * r, 0.5 * self.n_terms)
            prior = theta2 + offset_sum(0.5 * lat.s * lat.s, 0.5 * self.fwd.grid.n_cells)
        else:
            like = 0.5 * jnp.sum(r * r)
            prior = theta2 + 0.5 * jnp.sum(lat.s * lat.s)
        r0 = (kappa - data.kappa_obs) * data.weight
        out = {"max_disp": jnp.max(aux.max_disp), "chi2": jnp.sum(r0 * r0)}
        if data.modes is not None:  # the fit's own statistic: chi^2 of the kept components, and their number
            out["chi2_cut"] = jnp.sum(r * r)
            out["n_cut"] = jnp.sum(jnp.any(data.modes != 0, axis=(2, 3)))
        return like + prior, out

    def potential(self, lat: Latents, data: Data, smooth=None, precise: bool = False) -> Array:
        """The negative log posterior U (see the module docstring)."""
        return self.potential_and_aux(lat, data, smooth, precise)[0]

    def log_density(self, lat: Latents, data: Data) -> Array:
        """The log posterior density, up to a constant: ``-U``."""
        return -self.potential(lat, data)

    def potential_flat(self, flat: Array, data: Data, precise: bool = False) -> Array:
        """U on the flat layout: the dummies of the tails add their standard-normal prior
        (``precise``: minus :attr:`energy_offset`, see :meth:`potential_and_aux`)."""
        theta, s = self.layout.unpack(flat)
        dummies = flat * self.layout.dummy_mask().astype(flat.dtype)
        return self.potential(Latents(theta, s), data, precise=precise) + 0.5 * jnp.sum(dummies * dummies)

    def value_and_grad(self, smooth: bool = False):
        """Jitted ``(lat, data[, smooth]) -> ((U, aux), dU/dlat)`` on the pytree layout."""
        if smooth:
            return jax.jit(jax.value_and_grad(self.potential_and_aux, has_aux=True))
        return jax.jit(jax.value_and_grad(lambda lat, data: self.potential_and_aux(lat, data), has_aux=True))

    def numpyro_model(self, data: Data) -> None:
        """The posterior as a NumPyro model over ONE flat latent site ``"latent"`` (the
        sampler layout), with deterministic sites for the parameters; its potential energy
        equals :meth:`potential_flat` plus a constant (tests/infer/posterior/test_model.py)."""
        import numpyro  # noqa: PLC0415
        import numpyro.distributions as dist  # noqa: PLC0415

        lay = self.layout
        flat = numpyro.sample("latent", dist.Normal(0.0, 1.0).expand([lay.size]).to_event(1))
        theta, s = lay.unpack(flat)
        for name, v in self.params(theta).items():
            numpyro.deterministic(name, v)
        kappa, _ = self.fwd(self.cosmology(theta), s)
        if data.modes is not None:  # the scale cut's Gaussian in whitened components (unit variance)
            r = self._whiten(kappa, data, None)
            numpyro.factor("kappa", -0.5 * jnp.sum(r * r))
            return
        sigma = data.sigma.astype(kappa.dtype)[:, None, None]
        observed = data.weight > 0
        numpyro.sample("kappa", dist.Normal(kappa, sigma).mask(observed).to_event(3), obs=data.kappa_obs)

    # -- placement ------------------------------------------------------------------------
    def zeros(self) -> Latents:
        """The prior's mode: theta = 0 (the prior medians), s = 0, placed sharded."""
        g = self.fwd.grid
        s = jax.jit(lambda: jnp.zeros(g.shape, g.jdtype), out_shardings=g.sharding)()
        return Latents(jax.device_put(jnp.zeros((self.prior.n,), g.jdtype), NamedSharding(g.mesh, P())), s)


def make_data(obs, fwd: ForwardModel, ell_max=None) -> Data:
    """:class:`Data` from an observation (:func:`fli.store.io.load_observation`), placed on the
    forward's mesh: each process builds only its blocks. ``ell_max`` (``Posterior.ell_max``):
    the scale cut's whitened Fourier rows under the observation's mask and noise."""
    mesh = fwd.grid.mesh
    sharding = NamedSharding(mesh, KAPPA_SPEC)
    n_bins, npix, _ = fwd.kappa_shape
    sigma = np.asarray(obs.noise_sigma, np.float64).reshape(-1)
    mask = np.ones((npix, npix), bool) if obs.mask is None else np.asarray(obs.mask, bool)
    weight = (np.broadcast_to(mask, (n_bins, npix, npix)) / sigma[:, None, None]).astype(fwd.grid.dtype)
    kobs = obs.kappa_obs
    if not isinstance(kobs, jax.Array) or kobs.sharding != sharding:
        host = np.asarray(kobs, fwd.grid.dtype)
        kobs = jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])
    w = jax.make_array_from_callback(weight.shape, sharding, lambda idx: weight[idx])
    sig = jax.device_put(jnp.asarray(sigma, fwd.grid.jdtype), NamedSharding(mesh, P()))
    modes = None
    if ell_max is not None:
        from fli.infer.posterior.scale_cut import cut_rows  # noqa: PLC0415

        rows = cut_rows(fwd.kappa_shape, fwd.geometry.fov_deg, ell_max, mask, sigma)[0].astype(fwd.grid.dtype)
        modes = jax.make_array_from_callback(rows.shape, NamedSharding(mesh, P(None, *KAPPA_SPEC)),
                                             lambda idx: rows[idx])
    return Data(kobs.astype(fwd.grid.jdtype), w, sig, modes)


def build_posterior(cfg: Config, obs=None, mesh=None, log: logging.Logger | None = None) -> Posterior:
    """The posterior of a validated config, for an observation (its n(z) tables replace the
    config's ``survey.bins``) or, with ``obs=None``, for the config's own survey.

    Warns, naming each parameter, where a mock's truth differs from a fixed (non-sampled)
    parameter: that analysis is misspecified.
    """
    log = log or logging.getLogger("fli")
    bins = None if obs is None else list(obs.nz_bins)
    fwd = build_forward(cfg, bins=bins, mesh=mesh)
    base = fiducial_cosmology(cfg)
    prior = PriorTransform.from_config(cfg.prior)
    truth = getattr(obs, "truth", None) or {}
    for name in ("Omega_c", "Omega_b", "h", "n_s", "sigma8", "w0", "wa"):
        if name in prior.names or name not in truth:
            continue
        fixed, true = float(getattr(base, name)), float(truth[name])
        if not math.isclose(fixed, true, rel_tol=1e-9, abs_tol=1e-12):
            log.warning("misspecified model: %s is fixed at cosmology.%s = %g but the mock's truth is %g "
                        "(sample it with prior.sample or set cosmology.%s)", name, name, fixed, true, name)
    for name in prior.names:
        if name in truth:
            p = cfg.prior.params[name]
            if p.dist != "normal" and not p.low < float(truth[name]) < p.high:
                log.warning("the mock's truth %s = %g lies outside its prior [%g, %g]", name, float(truth[name]),
                            p.low, p.high)
    if bins is not None and len(bins) != len(cfg.survey.bins):
        raise ConfigError(f"survey.bins has {len(cfg.survey.bins)} bins, the observation {len(bins)}")
    from fli.infer.posterior.scale_cut import check_ell_max  # noqa: PLC0415

    return Posterior(fwd, prior, base, check_ell_max(cfg.lensing.ell_max, len(fwd.bins)))
