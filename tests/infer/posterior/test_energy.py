"""Energies of the samplers in float32: compensated sums against float64 (fli/infer/posterior/energy.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

from fli.infer.posterior.energy import offset_sum
from fli.sim.sharding import FIELD_SPEC, make_mesh
from tests.helpers.posterior import small_posterior


@pytest.mark.parametrize("pdims", [(1, 1), (2, 4)])
def test_offset_sum_of_a_sharded_field_matches_float64(pdims):
    """64^3 squares: sum ~ 1.3e5, offset D/2; the result (~-368) must equal float64's to its
    float32 spacing (3e-5 at 368), where the plain float32 sum is off by ~1e-2."""
    x = np.random.default_rng(1).normal(size=(64, 64, 64)).astype(np.float32)
    mesh = make_mesh(pdims)
    xs = jax.device_put(jnp.asarray(x), NamedSharding(mesh, FIELD_SPEC))
    c = 0.5 * x.size
    exact = 0.5 * np.sum(x.astype(np.float64) ** 2) - c
    f = jax.jit(lambda v: offset_sum(0.5 * v * v, c))
    got = f(xs)
    assert got.dtype == jnp.float32
    assert float(got) == pytest.approx(exact, abs=6e-5)
    plain = float(jax.jit(lambda v: 0.5 * jnp.sum(v * v))(xs)) - c
    assert abs(plain - exact) > 1e-3  # what the float64 sum is for
    g = jax.jit(jax.grad(lambda v: offset_sum(0.5 * v * v, c)))(xs)
    np.testing.assert_array_equal(np.asarray(g), x)  # d/dx of 0.5 x^2
    # the field is reduced where it lives: one scalar crosses devices, never the field
    hlo = f.lower(xs).compile().as_text()
    for line in hlo.splitlines():
        if "all-gather" in line or "all-reduce" in line or "all-to-all" in line:
            assert "f32[" not in line.split("=")[1].split("(")[0] or "[]" in line.split("=")[1].split("(")[0], line


def _trajectory_delta_h(post, data, z0, r0, precise, n_steps=10, step_size=0.05):
    from numpyro.infer.hmc_util import velocity_verlet

    from fli.infer.sample.base import kinetic_energy

    ke = kinetic_energy(post.layout.size, precise=precise)
    pe = lambda z: post.potential_flat(z, data, precise=precise)

    @jax.jit
    def run(z0, r0):
        init, update = velocity_verlet(pe, ke)
        imm = jnp.ones_like(z0)
        st = init(z0, r0)
        h0 = st.potential_energy + ke(imm, r0)
        st = jax.lax.fori_loop(0, n_steps, lambda i, s: update(step_size, imm, s), st)
        return st.potential_energy + ke(imm, st.r) - h0

    return float(run(z0, r0))


@pytest.mark.slow(seconds=145)  # (64^3 in float32 and float64); 143 s in the fresh-clone CI of 469bd9a, 80 s alone
def test_energy_change_of_one_trajectory_at_64_cubed_matches_float64():
    """The issue's test: D = 64^3 (+ 2 parameters), linear forward, 10 leapfrog steps from the
    truth (step size 0.05) with a unit momentum. float32 fields with float64-summed energies give the float64
    run's Delta H to 1e-3; plain float32 sums do not (H ~ 2.6e5 has a float32 spacing of
    0.016, and the sums themselves are off by more)."""
    extra = ["simulation.mesh=[64,64,64]", "simulation.forward=linear", "simulation.halo=3"]
    rng = np.random.default_rng(5)
    post, data, lat = small_posterior((2, 2), extra=extra)
    z32 = post.layout.pack(lat.theta, lat.s)
    r32 = jax.device_put(rng.normal(size=post.layout.size).astype(np.float32), post.layout.sharding)
    dh_precise = _trajectory_delta_h(post, data, z32, r32, precise=True)
    dh_plain = _trajectory_delta_h(post, data, z32, r32, precise=False)
    with jax.enable_x64(True):
        # the same point, momentum and data in float64 (a float64 draw of the noise would differ)
        post64, _, _ = small_posterior((2, 2), extra=extra, dtype="float64")
        z64 = jax.device_put(np.asarray(z32, np.float64), post64.layout.sharding)
        r64 = jax.device_put(np.asarray(r32, np.float64), post64.layout.sharding)
        data64 = jax.tree.map(lambda a: jax.device_put(np.asarray(a, np.float64), a.sharding), data)
        dh64 = _trajectory_delta_h(post64, data64, z64, r64, precise=False)
    assert abs(dh64) > 1e-3  # the trajectory moves the energy: the comparison is not trivially met
    assert dh_precise == pytest.approx(dh64, abs=1e-3)
    assert abs(dh_plain - dh64) > 1e-3, (dh_plain, dh64)
    print(f"Delta H: float64 {dh64:.6g}, float32 + float64 sums {dh_precise:.6g}, plain float32 {dh_plain:.6g}")
