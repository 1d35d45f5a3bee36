"""The field's data-constrained projections (fli/infer/sample/projections.py): their numbers, and that
recording them at every draw gathers nothing of the field on 8 devices."""

import jax
import jax.numpy as jnp
import numpy as np

from fli.infer.sample.precondition import VECS_SPEC, LowRank
from fli.infer.sample.projections import project, top
from fli.sim.sharding import hlo_collectives as collectives
from fli.sim.sharding import make_mesh
from tests.helpers.targets import Gaussian


def _projector(lay, k, seed=0):
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(lay.size, k)))
    vecs = jax.device_put(jnp.asarray(q.T, jnp.float32), jax.NamedSharding(lay.mesh, VECS_SPEC))
    ref = jax.device_put(jnp.asarray(np.random.default_rng(seed + 1).normal(size=lay.size), jnp.float32),
                         lay.sharding)
    lam = jax.device_put(jnp.linspace(50.0, 1.0, k), jax.NamedSharding(lay.mesh, jax.P()))
    return LowRank(ref, vecs, lam), q


def test_projections_of_a_packed_draw_are_v_dot_z_minus_ref_and_gather_nothing():
    """On 8 devices: the projections of ``pack(theta, s)`` equal numpy's ``V (z - ref)``, the
    top ``k`` keep the leading rows, and the compiled program's only collective is one
    all-reduce of the ``k`` numbers (the field stays where it is)."""
    lay = Gaussian(make_mesh((2, 4))).layout
    proj, q = _projector(lay, 6)
    theta = jnp.asarray([0.3, -1.2], jnp.float32)
    s = jax.device_put(jax.random.normal(jax.random.PRNGKey(3), lay.shape, jnp.float32),
                       jax.NamedSharding(lay.mesh, jax.P("x", "y")))
    fn = jax.jit(lambda p, th, f: project(p, lay.pack(th, f)))
    z = np.asarray(jax.jit(lay.pack)(theta, s), np.float64)
    want = q.T @ (z - np.asarray(proj.ref, np.float64))
    np.testing.assert_allclose(np.asarray(fn(proj, theta, s)), want, atol=2e-5)  # float32 sums of 258 terms
    three = top(proj, 3)
    np.testing.assert_allclose(np.asarray(fn(three, theta, s)), want[:3], atol=2e-5)
    assert three.vecs.sharding.spec == proj.vecs.sharding.spec
    ops = collectives(fn.lower(proj, theta, s).compile().as_text())
    assert all(op == "all-reduce" and n <= max(6, lay.n_tail) for op, n in ops), ops
    assert ("all-reduce", 6) in ops, ops  # the parse sees the projections' one sum
    assert project(None, jnp.zeros(4)).shape == (0,)
