"""fli: Bayesian field-level inference for weak-lensing cosmology, on JAX.

One module per stage: ``cosmology`` (background, growth, linear power), ``sharding``
(device mesh, distributed set-up, white noise), ``fft`` (distributed FFT and k-space
kernels), ``painting`` (CIC paint/read with halos), ``lpt`` and ``nbody`` (2LPT and FastPM),
``power`` (power spectra), ``lensing`` (Born convergence), ``io`` (mock files), and ``cli``
(Hydra entry points).
"""

__version__ = "0.1.0"
