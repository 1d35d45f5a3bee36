"""Gradients of the whole mock forward model (white noise, Omega_c, sigma8 -> kappa) vs finite differences."""

import jax
import jax.numpy as jnp
import numpy as np

from fli.cli.common import compose
from fli.cli.mock import build
from fli.lensing import born_convergence, plane_hook
from fli.nbody import simulate
from fli.sharding import white_noise


def test_kappa_gradients_match_finite_differences():
    with jax.enable_x64(True):
        cfg, _ = compose(["experiment=tiny", "simulation.mesh=[8,8,32]", "simulation.halo=2",
                          "simulation.dtype=float64", "lensing.npix=8", "lensing.n_planes=4",
                          "distributed.pdims=[2,2]"])
        cosmo0, grid, geom, bins, a_steps = build(cfg)
        hook = plane_hook(geom, grid)
        w = jax.random.normal(jax.random.key(4), (len(bins), 8, 8), jnp.float64)

        def loss(omega_c, sigma8, s):
            cosmo = jax.tree.map(lambda v: jnp.asarray(v, jnp.float64),
                                 cosmo0.replace(Omega_c=omega_c, sigma8=sigma8))
            _, planes, _ = simulate(cosmo, s, grid, a_steps, hook=hook, adjoint="reversible")
            return jnp.sum(born_convergence(cosmo, planes, geom, grid, bins) * w)

        s = white_noise(2, grid.shape, grid.mesh, dtype=jnp.float64)
        v = white_noise(3, grid.shape, grid.mesh, dtype=jnp.float64)
        oc, s8 = 0.2607, 0.8102
        g_oc, g_s8, g_s = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(oc, s8, s)
        f = jax.jit(loss)
        eps = 1e-5  # central differences in float64: error ~eps^2 + 1e-16/eps, ~1e-10 relative
        fd = [(f(oc + eps, s8, s) - f(oc - eps, s8, s)) / (2 * eps),
              (f(oc, s8 + eps, s) - f(oc, s8 - eps, s)) / (2 * eps),
              (f(oc, s8, s + eps * v) - f(oc, s8, s - eps * v)) / (2 * eps)]
        ad = [g_oc, g_s8, jnp.sum(g_s * v)]
        for a, b in zip(ad, fd, strict=True):
            # CIC paint/read are piecewise linear: a particle crossing a cell edge inside +-eps
            # perturbs the difference; 1e-4 relative leaves room for that and nothing else
            np.testing.assert_allclose(float(a), float(b), rtol=1e-4)
        assert abs(float(g_oc)) > 0 and abs(float(g_s8)) > 0
