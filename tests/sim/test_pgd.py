"""The potential-gradient-descent shift (fli/sim/pgd.py): against its closed form on a plane wave,
its filter's limits, and its derivatives through the particle-plane hook by finite differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fli.lensing import born as L
from fli.cosmo.background import planck18
from fli.sim.grid import Grid
from fli.sim.nbody import Density, density_of
from fli.lensing.particle_planes import particle_plane_hook
from fli.sim.pgd import PGDParams, pgd_filter, pgd_shift
from fli.sim.sharding import make_mesh

SHAPE, BOX = (16, 16, 32), (100.0, 100.0, 200.0)


def _sharded(x, grid):
    return jax.device_put(x, jax.sharding.NamedSharding(grid.mesh, jax.sharding.PartitionSpec("x", "y")))


@pytest.mark.parametrize("pdims", [(1, 1), (2, 4)])
def test_shift_of_a_plane_wave_is_its_closed_form(pdims):
    """delta = A cos(k0 x) on the mesh, particles on their nodes: S_x = -alpha a^mu A O(k0)
    sin(k0 x) / k0 and S_y = S_z = 0 (spectral gradient and CIC read at the nodes are exact),
    pointing towards the crest."""
    grid = Grid(SHAPE, BOX, make_mesh(pdims), halo=1, dtype="float64")
    p = PGDParams(alpha=0.7, mu=1.5, kl=0.05, ks=0.4)
    k0 = 2 * np.pi * 3 / BOX[0]
    x = np.arange(SHAPE[0]) * BOX[0] / SHAPE[0]
    amp = 0.3
    with jax.enable_x64(True):
        rho = np.broadcast_to((1.0 + amp * np.cos(k0 * x))[:, None, None], SHAPE).copy()
        rho_k = grid.fft.rfft(_sharded(jnp.asarray(rho), grid))
        s = np.asarray(pgd_shift(rho_k, _sharded(jnp.zeros((*SHAPE, 3)), grid), 0.8, grid, p))
    o = np.exp(-(p.kl / k0) ** 2) * np.exp(-(k0 / p.ks) ** 4)
    want = -p.alpha * 0.8 ** p.mu * amp * o * np.sin(k0 * x) / k0
    np.testing.assert_allclose(s[:, 0, 0, 0], want, rtol=1e-10, atol=1e-12 * np.abs(want).max())
    assert np.abs(s[..., 1:]).max() < 1e-12 * np.abs(want).max()
    assert s[1, 0, 0, 0] < 0 < s[-1, 0, 0, 0]  # towards the crest at x = 0


def test_filter_high_and_low_pass():
    grid = Grid(SHAPE, BOX, make_mesh((1, 1)), halo=1, dtype="float64")
    with jax.enable_x64(True):
        f = np.asarray(pgd_filter(grid.fft, BOX, kl=0.2, ks=0.5, dtype=np.float64))
        k = np.asarray(jnp.sqrt(sum(c ** 2 for c in grid.fft.kvec(BOX, dtype=np.float64))))
    assert f.flat[0] == 0.0  # the mean
    sel = k > 0
    np.testing.assert_allclose(f[sel] * k[sel] ** 2, np.exp(-(0.2 / k[sel]) ** 2 - (k[sel] / 0.5) ** 4), rtol=1e-12)


def test_hook_with_the_shift_matches_finite_differences_and_is_off_at_alpha_zero():
    """Through the hook as the PM step calls it, with the density's FFT and stencil that the PM
    force hands over (fli.sim.nbody.density_of builds them from the same particles): derivatives in
    the particles' positions and in the painted density (its FFT's route) by central
    differences; alpha = 0 paints what the hook without the shift paints."""
    geom = L.LensGeometry.create(planck18(), (100.0, 100.0, 800.0), (8, 8, 64), 4, 5.0, 8, 0.25)
    grid = Grid((8, 8, 64), (100.0, 100.0, 800.0), make_mesh((2, 2)), halo=1, dtype="float64")
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        disp = _sharded(jnp.asarray(rng.uniform(-6, 6, size=(8, 8, 64, 3))), grid)
        # a density other than the particles' own, so that its derivative is not their positions'
        rho = _sharded(jnp.asarray(1.0 + 0.5 * rng.normal(size=(8, 8, 64))), grid)

        def dens(r, d):
            own = density_of(d, grid)
            return Density(r, grid.fft.rfft(r), own.stencil)

        w = jnp.asarray(rng.normal(size=(8, 8)))
        on = particle_plane_hook(geom, grid, pgd=PGDParams(alpha=0.5, kl=0.1, ks=0.5))
        off = particle_plane_hook(geom, grid, pgd=PGDParams(alpha=0.0))
        bare = particle_plane_hook(geom, grid)
        planes = jax.jit(lambda r, d: [h(dens(r, d), d, 0.9, 1)[0] for h in (on, off, bare)])(rho, disp)
        p_on, p_off, p_bare = (np.asarray(p) for p in planes)
        np.testing.assert_array_equal(p_off, p_bare)
        assert np.abs(p_on - p_bare).max() > 1.0

        def loss(d, r):
            return jnp.sum(w * on(dens(r, d), d, 0.9, 1)[0])

        vg = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
        gd, gr = vg(disp, rho)[1]
        for g, x, which in ((gd, disp, 0), (gr, rho, 1)):
            v = jnp.asarray(rng.normal(size=x.shape))
            h = 1e-6
            args_p = [disp, rho]
            args_m = [disp, rho]
            args_p[which] = x + h * v
            args_m[which] = x - h * v
            fd = (vg(*args_p)[0] - vg(*args_m)[0]) / (2 * h)
            # piecewise-linear CIC: a step of 1e-6 that crosses no cell edge is exact to rounding
            assert float(jnp.vdot(g, v)) == pytest.approx(float(fd), rel=1e-6), which
