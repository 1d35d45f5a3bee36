"""fli: Bayesian field-level inference for weak-lensing cosmology, on JAX.

One package per responsibility, each importing only those listed after it:

* ``cli``: the commands (Hydra entry points);
* ``infer``: the posterior, MAP fits, MUSE, chains, diagnostics; ``mock``: making a mock;
* ``forward``: the one forward model; ``store``: observations, arrays, manifests on disk;
  ``plots``: matplotlib helpers;
* ``lensing``: light cone, planes, Born convergence, n(z), Limber;
* ``sim``: the distributed particle-mesh simulation;
* ``cosmo``: background, growth, linear and halofit power;
* ``config``: the config schema.
"""

__version__ = "0.1.0"
