"""Gradients of the whole forward model (white noise, Omega_c, sigma8 -> kappa) vs finite differences.

The light cone is traced: a finite difference in Omega_c moves the PM step times and the
plane crossing times too, so this checks the gradient through them as well.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fli.cli.compose import compose
from fli.forward import build_forward, fiducial_cosmology
from fli.sim.sharding import white_noise


@pytest.mark.parametrize("kind", ["pm", pytest.param("linear", marks=pytest.mark.slow(seconds=15)),
                                  pytest.param("pm-particles", marks=pytest.mark.slow(seconds=15))])
def test_kappa_gradients_match_finite_differences(kind):
    """``pm-particles``: lens planes painted from 2 x 2 sub-particles (the default's planes),
    through the reversible adjoint and the sub-particles' exchange between devices."""
    planes = ["lensing.planes=particles", "lensing.subparticles=2"] if kind == "pm-particles" else []
    with jax.enable_x64(True):
        cfg, _ = compose(["experiment=tiny", "simulation.mesh=[8,8,32]", "simulation.halo=2",
                          "simulation.dtype=float64", "lensing.npix=8", "lensing.n_planes=4",
                          "distributed.pdims=[2,2]", "simulation.adjoint=reversible",
                          f"simulation.forward={kind.split('-')[0]}", *planes])
        fwd = build_forward(cfg)
        cosmo0 = fiducial_cosmology(cfg)
        w = jax.random.normal(jax.random.key(4), fwd.kappa_shape, jnp.float64)

        def loss(omega_c, sigma8, s):
            kappa, _ = fwd(cosmo0.replace(Omega_c=omega_c, sigma8=sigma8), s)
            return jnp.sum(kappa * w)

        s = white_noise(2, fwd.grid.shape, fwd.grid.mesh, dtype=jnp.float64)
        v = white_noise(3, fwd.grid.shape, fwd.grid.mesh, dtype=jnp.float64)
        oc, s8 = 0.2607, 0.8102
        vg = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
        _, (g_oc, g_s8, g_s) = vg(oc, s8, s)
        f = lambda *args: vg(*args)[0]  # one compiled program: a second, of the loss alone, cost 16 s
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


def test_linear_forward_is_linear_in_the_noise():
    """kappa(a s1 + b s2) = a kappa(s1) + b kappa(s2) at fixed cosmology (to float32 round-off)."""
    cfg, _ = compose(["experiment=tiny", "simulation.forward=linear", "distributed.pdims=[2,2]"])
    fwd = build_forward(cfg)
    c = fiducial_cosmology(cfg)
    f = jax.jit(lambda s: fwd(c, s)[0])
    s1 = white_noise(1, fwd.grid.shape, fwd.grid.mesh)
    s2 = white_noise(2, fwd.grid.shape, fwd.grid.mesh)
    lhs = np.asarray(f(0.7 * s1 - 1.3 * s2))
    rhs = 0.7 * np.asarray(f(s1)) - 1.3 * np.asarray(f(s2))
    np.testing.assert_allclose(lhs, rhs, atol=1e-5 * np.abs(rhs).max())
    assert np.abs(rhs).max() > 1e-4  # a real lensing signal, not zeros
