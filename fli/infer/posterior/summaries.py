"""What each draw or estimate of the field is summarised by, computed beside the posterior.

The samplers, fli-map and fli-diagnose ask here for a field's spectra and linear field instead
of calling the physics themselves:

* :func:`draw_spectra`: P(k) of a draw's white noise and of its linear density field at
  a = 1, from k-space in one binning pass (traceable, sharded);
* :func:`linear_field_of`: the linear density field at a = 1 of latents;
* :func:`truth_linear_field`: the same for a mock's truth.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fli.cosmo.background import growth_factor
from fli.sim.lpt import linear_field, linear_modes
from fli.sim.power import binned_spectra


def draw_spectra(post, theta, s, kedges):
    """``(P_s(k), P_lin(k))``: binned power of the white noise ``s`` and of the linear field at
    a = 1 of ``(theta, s)``, in the bins ``kedges`` [h/Mpc]. The linear field's modes are the
    white noise's times ``sqrt(P(k; theta))`` (no round trip through real space)."""
    grid = post.fwd.grid
    cosmo = post.cosmology(theta)
    s_k, lin_k = grid.fft.rfft(s), linear_modes(cosmo, s, grid)
    _, (pk_s, pk_lin), _ = binned_spectra(grid.fft, grid.box, [(s_k, s_k), (lin_k, lin_k)], kedges)
    return pk_s, pk_lin * growth_factor(cosmo, jnp.asarray(1.0, grid.jdtype)) ** 2


def _linear_at_1(post, cosmo, s):
    g = post.fwd.grid
    return jax.jit(lambda c, x: linear_field(c, x, g, 1.0))(cosmo, s)


def linear_field_of(post, theta, s):
    """The linear density field at a = 1 of latents ``(theta, s)``, sharded like ``s``."""
    return _linear_at_1(post, post.cosmology(theta), s)


def truth_linear_field(post, obs):
    """The same for a mock's truth: its white noise at its cosmology."""
    return _linear_at_1(post, post.truth_cosmology(obs.truth), obs.white_noise.astype(post.fwd.grid.jdtype))
