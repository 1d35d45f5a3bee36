"""Chains on the posterior: the kernel interface and NumPyro's NUTS and HMC (``base``, ``kernels``),
fli's MCLMC (``mclmc``, ``adjusted_mclmc``, ``autocorrelation``), starts (``start``),
preconditioners and projections (``precondition``, ``precondition_fourier``, ``projections``),
the chunked resumable run (``run``, ``chunk``, ``run_store``, ``relayout``) and its ArviZ
InferenceData (``inference_data``)."""

from fli.infer.sample.run import run_chains  # noqa: F401
