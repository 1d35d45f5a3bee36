"""Every kernel behind the seam of :mod:`fli.infer.sample.base`, by name: NumPyro's NUTS and HMC
(:func:`~fli.infer.sample.base.numpyro_kernel`) and fli's MCLMC (:mod:`fli.infer.sample.mclmc`), on the
latent of ``inference.sampler``. A module of its own so that the seam imports no kernel."""

from __future__ import annotations

from fli.config import KERNELS, PRECONDITIONERS, SAMPLERS
from fli.infer.sample.adjusted_mclmc import adjusted_mclmc_kernel
from fli.infer.sample.mclmc import TARGET, mclmc_kernel
from fli.infer.posterior.model import Posterior
from fli.infer.sample.precondition import lowrank_latent
from fli.infer.sample.base import LATENTS, Kernel, numpyro_kernel


def make_kernel(post: Posterior, sampler: str = "sharded", kernel: str = "nuts", integrator: str = "mclachlan",
                precondition: str = "none", mclmc_length: str = "variance", mclmc_energy_error: float = TARGET,
                **kw) -> Kernel:
    """The kernel ``kernel`` on the latent of ``inference.sampler`` (``sharded`` or
    ``numpyro``): NumPyro's NUTS or HMC (:func:`numpyro_kernel`, with ``kw``), or MCLMC,
    unadjusted (:func:`fli.infer.sample.mclmc.mclmc_kernel`) or adjusted
    (:func:`fli.infer.sample.adjusted_mclmc.adjusted_mclmc_kernel`), which read ``num_warmup``,
    ``step_size`` (and ``target_accept``, adjusted) of ``kw`` and their own ``integrator``
    (and ``mclmc_length`` and ``mclmc_energy_error``, unadjusted).

    ``precondition="lowrank"``: the kernel moves the preconditioned latent
    (:func:`fli.infer.sample.precondition.lowrank_latent`, sampler ``sharded`` only) and reads
    ``Preconditioned(data, pre)`` as its data."""
    if sampler not in SAMPLERS:
        raise ValueError(f"inference.sampler must be one of {SAMPLERS}, got {sampler!r}")
    if kernel not in KERNELS:
        raise ValueError(f"inference.kernel must be one of {KERNELS}, got {kernel!r}")
    if precondition not in PRECONDITIONERS:
        raise ValueError(f"inference.precondition must be one of {PRECONDITIONERS}, got {precondition!r}")
    if precondition == "lowrank" and sampler != "sharded":
        raise ValueError("inference.precondition=lowrank acts on the flat latent: set inference.sampler=sharded")
    latent = lowrank_latent(post) if precondition == "lowrank" else LATENTS[sampler](post)
    if kernel == "mclmc":
        return mclmc_kernel(post, latent, num_warmup=kw.get("num_warmup", 100),
                            step_size=kw.get("step_size", 0.1), integrator=integrator,
                            tune_L=mclmc_length, energy_error=mclmc_energy_error)
    if kernel == "adjusted_mclmc":
        return adjusted_mclmc_kernel(post, latent, num_warmup=kw.get("num_warmup", 100),
                                     step_size=kw.get("step_size", 0.1), target_accept=kw.get("target_accept", 0.9),
                                     integrator=integrator)
    return numpyro_kernel(post, latent, kernel=kernel, **kw)
