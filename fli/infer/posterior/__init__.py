"""The posterior of (theta, s): the forward model, likelihood and priors as one potential over a
flat sharded latent (``model``, ``layout``, ``priors``, ``params``, ``energy``), the scale cut
(``scale_cut``), summaries of draws (``summaries``), the exact posterior of the linear forward
(``exact``), and the set-up every command shares (``setup``)."""

from fli.infer.posterior.model import Data, Latents, Posterior, build_posterior, make_data  # noqa: F401
from fli.infer.posterior.setup import prepare  # noqa: F401
