"""The whole forward model (2LPT + PM, value and gradient) inside NumPyro NUTS on 8 devices.

XLA's CPU FFT crashed inside NUTS on sharded models when local FFTs act on 3D arrays; this
runs the real simulation (pencil FFT, CIC paint/read with halo exchange) under NUTS on the
(2, 4) mesh, with the latent entering the sharded world through ``to_field``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS

from fli.cosmology import planck18
from fli.grid import Grid
from fli.nbody import density, simulate
from fli.sharding import make_mesh, to_field, white_noise


@pytest.mark.slow(seconds=75)  # tests/infer/test_nuts.py samples the posterior in the default set
def test_forward_model_under_nuts_on_8_devices():
    grid = Grid((8, 8, 8), (200.0, 200.0, 200.0), make_mesh((2, 4)), halo=2)
    a_steps = np.array([0.2, 0.6, 1.0])
    base = planck18()

    def forward(omega_c, s):
        cosmo = base.replace(Omega_c=omega_c)
        st, _, _ = simulate(cosmo, to_field(s, grid.mesh), grid, a_steps, adjoint="reversible")
        return density(st.disp, grid)

    def model(data):
        omega_c = numpyro.sample("Omega_c", dist.Uniform(0.15, 0.4))
        s = numpyro.sample("s", dist.Normal(0, 1).expand(grid.shape).to_event(3))
        numpyro.sample("obs", dist.Normal(forward(omega_c, s), 0.1).to_event(3), obs=data)

    truth = np.asarray(white_noise(0, grid.shape, make_mesh((1, 1))))
    data = jax.device_put(forward(0.26, jnp.asarray(truth)), grid.sharding)
    mcmc = MCMC(NUTS(model, max_tree_depth=2), num_warmup=3, num_samples=3,
                jit_model_args=True, progress_bar=False)
    mcmc.run(jax.random.key(0), data, extra_fields=("energy", "diverging"))
    samples = mcmc.get_samples()
    assert samples["s"].shape == (3, *grid.shape)
    assert np.all(np.isfinite(np.asarray(samples["Omega_c"])))
    assert np.all(np.isfinite(np.asarray(mcmc.get_extra_fields()["energy"])))
