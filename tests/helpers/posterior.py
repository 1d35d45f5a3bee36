"""The small posterior shared by the model tests, their multi-process worker and the command tests.

8 x 8 x 32 cells, 4 lens planes, 8 x 8 pixels, 2 source bins: compiles in seconds. The data
are the forward model's own kappa at the truth plus shape noise, so the posterior is well posed.
"""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

SMALL = ["experiment=tiny", "simulation.mesh=[8,8,32]", "simulation.halo=2", "lensing.npix=8",
         "lensing.n_planes=4"]

# a short fli-nuts chain of the SMALL posterior: 6 warm-up + 6 draws in chunks of 4 (the last
# chunk straddles nothing: 4, 4, 4), fields of every 2nd draw; tree depth <= 3 keeps a draw at
# <= 7 gradients. It tests the machinery, not convergence.
CHAIN = ["inference.num_warmup=6", "inference.num_samples=6", "inference.chunk=4", "inference.field_thin=2",
         "inference.max_tree_depth=3", "seed=3"]


def small_posterior(pdims=(1, 1), extra=(), dtype="float32"):
    """(posterior, data, latents at the truth) on ``pdims``."""
    from fli.cli.compose import compose
    from fli.infer.posterior.model import Latents, build_posterior, make_data
    from fli.sim.sharding import make_mesh, white_noise

    cfg, _ = compose([*SMALL, f"distributed.pdims=[{pdims[0]},{pdims[1]}]", f"simulation.dtype={dtype}",
                      *extra])
    post = build_posterior(cfg, mesh=make_mesh(pdims))
    g = post.fwd.grid
    s = white_noise(0, g.shape, g.mesh, dtype=g.jdtype)
    theta = jnp.asarray(post.theta_of({"Omega_c": 0.2607, "sigma8": 0.8102}), g.jdtype)
    kappa, _ = jax.jit(lambda l: post.predict(l))(Latents(theta, s))
    k = np.asarray(jax.device_get(kappa)) if kappa.is_fully_addressable else None
    if k is None:
        from fli.sim.sharding import process_allgather
        k = process_allgather(kappa)
    sigma = np.array([2e-3, 3e-3])
    noise = np.random.default_rng(1).normal(size=k.shape) * sigma[:, None, None]
    obs = SimpleNamespace(kappa_obs=(k + noise).astype(g.dtype), noise_sigma=sigma, mask=None)
    return post, make_data(obs, post.fwd, post.ell_max), Latents(theta, s)


def truncate_state(checkpoint):
    """Damage a checkpoint as a full disk or a killed copy would: its state files cut to a third."""
    for p in (checkpoint / "state").rglob("*"):
        if p.is_file() and p.stat().st_size > 64:
            p.write_bytes(p.read_bytes()[: p.stat().st_size // 3])
