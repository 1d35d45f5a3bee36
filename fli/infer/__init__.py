"""Inference on the posterior of (theta, s), one package per stage, each importing only those
listed before it:

* ``posterior``: the NumPyro model, priors, the flat sharded latent, energies, the exact linear posterior;
* ``fit``: Optax MAP fits (``fli-map``), Laplace errors, Hessian-vector products, low-rank curvature;
* ``muse``: MUSE parameter estimates from field fits on the data and on simulations;
* ``sample``: the kernels (NumPyro's NUTS and HMC, fli's MCLMC), chunked resumable chains (``fli-sample``);
* ``diagnose``: ArviZ's diagnostics, verdicts and the report (``fli-diagnose``);

with ``checkpoint`` (orbax checkpoints with checksums) and ``config_keys`` (which config keys a
resumed run may change) beneath them all.
"""
