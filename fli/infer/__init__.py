"""Inference over the field-level posterior: the NumPyro model, MAP (Optax) with a Laplace
error, and the shared checkpoint code. The forward model itself lives in :mod:`fli.forward`."""
