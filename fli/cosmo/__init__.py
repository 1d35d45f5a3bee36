"""The cosmology: the flat (w0, wa) background with radiation, distances and growth (``background``),
the linear matter power normalised to sigma8 (``linear_power``), and halofit (``halofit``).
Functions of a frozen pytree ``Cosmology``, so that ``jax.grad`` reaches every parameter."""

from fli.cosmo.background import Cosmology, a_of_chi, comoving_distance, growth_factor, planck18  # noqa: F401
from fli.cosmo.halofit import halofit_power  # noqa: F401
