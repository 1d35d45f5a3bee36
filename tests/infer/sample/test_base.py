"""The sharded sampler (``inference.sampler=sharded``): NumPyro's NUTS on the flat layout.

* the compiled NUTS step and the compiled MAP step on 8 devices hold no collective beyond
  those of the forward model's own gradient, counted in the same test, but scalar sums;
  NumPyro's own layout (``inference.sampler=numpyro``) gathers the field: the parse sees it;
* on a Gaussian target, the sharded kernel on 8 devices follows stock NumPyro NUTS on one
  device, draw for draw (same key, same start).
"""

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fli.sim.sharding import hlo_collectives as collectives
from tests.helpers.posterior import small_posterior
from tests.helpers.targets import Gaussian

# a field of 16 x 16 x 32 on (2, 4): blocks of 8 x 4 x 32 hold the halo of 2 comfortably
FIELD16 = ["simulation.mesh=[16,16,32]"]


def beyond_the_forward(ops: Counter, own: Counter, n_small: int) -> list:
    """The collectives of ``ops`` that are not the forward model's own (``own``, its compiled
    value-and-gradient) nor all-reduces of at most ``n_small`` numbers: what a sampler or an
    optimiser adds. A kind of the forward's own may appear more often (a line search evaluates
    the objective several times): each is still one of the forward's."""
    return [(op, n) for (op, n), c in (ops - own).items()
            if (op, n) not in own and not (op == "all-reduce" and n <= n_small)]


def _step_hlo(post, data, sampler: str, kernel=None) -> str:
    """The compiled HLO of one vmapped step of ``kernel`` (default: NUTS on ``sampler``)."""
    from fli.infer.sample.kernels import make_kernel

    lay = post.layout
    kernel = kernel or make_kernel(post, sampler, kernel="nuts", num_warmup=10, max_tree_depth=4)
    z0 = jax.ShapeDtypeStruct((1, lay.size), post.fwd.grid.jdtype,
                              sharding=jax.NamedSharding(lay.mesh, jax.P(None, *lay.sharding.spec)))
    keys = jax.ShapeDtypeStruct((1, 2), jnp.uint32, sharding=jax.NamedSharding(lay.mesh, jax.P()))
    state = kernel.template(z0, keys, data)
    step = jax.jit(lambda s, d: jax.vmap(kernel.step, in_axes=(0, None))(s, d))
    return step.lower(state, data).compile().as_text()


@pytest.fixture(scope="module")
def post8():
    return small_posterior((2, 4), extra=FIELD16)


@pytest.fixture(scope="module")
def gradient_collectives(post8):
    """The forward model's own: the compiled value-and-gradient of the posterior (measured:
    the FFT's 96 all-to-alls of block pieces, two gathers of a lens plane or the map, a few
    scalar sums)."""
    post, data, lat = post8
    flat = post.layout.pack(lat.theta, lat.s)
    hlo = jax.jit(jax.value_and_grad(lambda z, d: post.potential_flat(z, d, precise=True))).lower(flat, data)
    ops = collectives(hlo.compile().as_text())
    assert any(op == "all-to-all" for op, _ in ops)  # the pencil FFT's transposes: the parse sees them
    field = post.fwd.grid.n_cells
    assert not [k for k in ops if k[0] != "all-to-all" and k[1] >= field // 8], ops  # no field gather
    return ops


@pytest.mark.slow(seconds=55)  # (an 8-device PM gradient and NUTS step compiled); keeps the default suite < 600 s
def test_the_sharded_nuts_step_gathers_no_field(post8, gradient_collectives):
    """Every collective of the compiled NUTS step is one of the gradient's, one for one (NumPyro
    traces the leapfrog's gradient once, in the tree's loop), plus all-reduces of scalars:
    the kinetic energy and the U-turn test's inner products."""
    post, data, _ = post8
    ops = collectives(_step_hlo(post, data, "sharded"))
    extra = ops - gradient_collectives
    assert not (gradient_collectives - ops), "the step should hold the gradient's collectives"
    assert extra and all(op == "all-reduce" and n <= post.layout.n_tail for op, n in extra), extra


@pytest.mark.slow(seconds=35)  # NumPyro's own layout compiled on 8 devices
def test_numpyros_own_layout_gathers_the_field(post8, gradient_collectives):
    """The comparison the sharded sampler exists for: NumPyro ravels (theta, field) into one
    replicated vector, so its step gathers the field (measured: 25 field-sized all-gathers)."""
    post, data, _ = post8
    ops = collectives(_step_hlo(post, data, "numpyro"))
    added = beyond_the_forward(ops, gradient_collectives, post.layout.n_tail)
    assert [k for k in added if k[0] == "all-gather" and k[1] >= post.fwd.grid.n_cells // 8], added


@pytest.mark.slow(seconds=55)  # each: one 8-device step compiled (54 s in CI)
@pytest.mark.parametrize("kernel", ["adjusted_mclmc", "nuts", "mclmc"])
def test_the_preconditioned_kernels_gather_no_field(post8, gradient_collectives, kernel):
    """fli's MCLMC kernels and NUTS in the low-rank preconditioned latent
    (fli/infer/sample/precondition.py), compiled on 8 devices: every collective beyond the forward
    model's own is an all-reduce of at most ``rank`` numbers (``V y``, ``V g``, the inner
    products); nothing gathers the field or a row of ``V``. MCLMC's step is one of the adjusted
    kernel's integrator steps, plus, with ``mclmc_length=autocorrelation`` (its warm-up long
    enough for the window), the projections it records: the parameters read through ``V`` and
    random-sign sums of the position."""
    from fli.infer.sample.kernels import make_kernel
    from fli.infer.sample.precondition import VECS_SPEC, LowRank, Preconditioned

    post, data, lat = post8
    lay, rank = post.layout, 8
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(lay.size, rank)))
    vecs = jax.device_put(jnp.asarray(q.T, jnp.float32), jax.NamedSharding(lay.mesh, VECS_SPEC))
    pre = LowRank(lay.pack(lat.theta, lat.s), vecs,
                  jax.device_put(jnp.linspace(100.0, 1.0, rank), jax.NamedSharding(lay.mesh, jax.P())))
    kd = Preconditioned(data, pre)
    kw = dict(mclmc_length="autocorrelation", num_warmup=200) if kernel == "mclmc" else dict(num_warmup=10)
    k = make_kernel(post, "sharded", kernel=kernel, integrator="leapfrog", precondition="lowrank", max_tree_depth=3,
                    **kw)
    ops = collectives(_step_hlo(post, kd, "sharded", kernel=k))
    added = beyond_the_forward(ops, gradient_collectives, max(rank, lay.n_tail))
    assert not added, added
    assert any(op == "all-reduce" and n == rank for op, n in ops), ops  # V y: the parse sees the projection


def test_optax_inner_products_of_a_sharded_field_gather_nothing():
    """Optax's ``tree.vdot`` (mended in fli.infer.fit.optimize: on jax 0.10 Optax's own version
    test picks ``jnp.vdot``, which ravels and so gathers a field sharded over x and y)."""
    import optax

    from fli.infer.fit import optimize
    from fli.sim.sharding import field_sharding, make_mesh

    assert isinstance(optimize.mend_optax_inner_products(), bool)  # what fli-map does before it optimises
    mesh = make_mesh((2, 4))
    x = jax.device_put(jnp.ones((16, 16, 8)), field_sharding(mesh))
    hlo = jax.jit(lambda a, b: optax.tree.vdot({"s": a}, {"s": b})).lower(x, x).compile().as_text()
    assert not [k for k in collectives(hlo) if k[0] == "all-gather"], collectives(hlo)
    assert float(jax.jit(optax.tree.vdot)(x, 2 * x)) == 2 * 16 * 16 * 8


@pytest.mark.slow(seconds=90)  # each (an L-BFGS step holds three line-search gradients; CI: 130 s, adam 46 s)
@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_the_map_step_gathers_no_field_and_its_state_stays_sharded(post8, optimizer):
    from fli.cli.compose import compose
    from fli.infer.fit.optimize import init_state, make_step
    from tests.helpers.posterior import SMALL

    post, data, lat = post8
    cfg, _ = compose([*SMALL, *FIELD16, f"inference.map.optimizer={optimizer}"])
    step, opt = make_step(post, cfg.inference.map)
    width = jnp.asarray(2.0, post.fwd.grid.jdtype)  # the annealed objective: its smoothing included
    state = init_state(opt, lat, post)  # as fli-map starts it: Optax's own init leaves L-BFGS's memory whole
    comp = step.lower(lat, state, data, width).compile()
    ref = jax.jit(jax.value_and_grad(lambda p, d, w: post.potential(p, d, w))).lower(lat, data, width).compile()
    ops, own = collectives(comp.as_text()), collectives(ref.as_text())
    # L-BFGS: the inner products of its two-loop recursion and line search are scalar sums
    assert not beyond_the_forward(ops, own, post.layout.n_tail), (ops, own)
    assert not [k for k in own if k[0] != "all-to-all" and k[1] >= post.fwd.grid.n_cells // 8], own
    # every field-shaped leaf of the optimiser's state (moments, L-BFGS's memory) goes in and
    # comes out sharded
    shapes = jax.eval_shape(step, lat, state, data, width)[1]
    g = post.fwd.grid
    out = zip(jax.tree.leaves(shapes), jax.tree.leaves(comp.output_shardings[1]), strict=True)
    leaves = [(s.shape, sh) for s, sh in out if tuple(s.shape[-3:]) == g.shape]
    leaves += [(x.shape, x.sharding) for x in jax.tree.leaves(state) if tuple(x.shape[-3:]) == g.shape]
    # adam: its two moments; L-BFGS: its memories of position and gradient differences
    assert len(leaves) >= 2, [s for s, _ in leaves]
    block = (g.shape[0] // g.pdims[0], g.shape[1] // g.pdims[1], g.shape[2])
    for shape, sh in leaves:
        assert tuple(sh.shard_shape(shape))[-3:] == block, (shape, sh)


def _sharded_chain(target, z0, keys, n_warm, n, depth=5):
    """``n`` transitions of the sharded kernel's chains from ``z0 [C, size]``: positions
    ``[n, C, size]``, leapfrog steps and tree depths ``[n, C]``."""
    from fli.infer.sample.base import numpyro_kernel, sharded_latent

    kern = numpyro_kernel(target, sharded_latent(target), "nuts", num_warmup=n_warm, max_tree_depth=depth,
                          step_size=0.1)
    state = kern.init(z0, keys, None)

    def body(state, _):
        state, info = jax.vmap(kern.step, in_axes=(0, None))(state, None)
        return state, (state.z, info.num_steps, info.tree_depth)

    return jax.jit(lambda s: jax.lax.scan(body, s, None, length=n)[1])(state)


@pytest.mark.parametrize("depth, eps, uturns", [(3, 0.1, (0.0, 0.0)), (5, 0.12, (0.3, 0.7)), (8, 0.1, (1.0, 1.0))])
def test_nuts_records_whether_a_u_turn_or_the_depth_cap_ended_each_tree(depth, eps, uturns):
    """The ``turning`` statistic, from NumPyro's own tree: on the Gaussian target (scales 0.5 to
    1.5, so a trajectory turns after about pi / eps * scale steps) with a fixed step, 4 chains x
    50 transitions. A tree shorter than ``2^depth - 1`` steps can only have been stopped by a
    U-turn (no divergence here); at depth 3 every tree is cut by the cap, at depth 8 none is.
    At depth 5 with step 0.12 every tree is full (31 steps), so its length cannot tell, and
    about half of them turned at the last doubling (measured 0.49): the record tells them apart."""
    from fli.infer.sample.base import numpyro_kernel, sharded_latent
    from fli.sim.sharding import make_mesh

    target = Gaussian(make_mesh((1, 1)))
    kern = numpyro_kernel(target, sharded_latent(target), "nuts", num_warmup=0, max_tree_depth=depth, step_size=eps)
    z0 = jax.random.normal(jax.random.PRNGKey(1), (4, target.layout.size))
    keys = jax.vmap(lambda c: jax.random.fold_in(jax.random.PRNGKey(2), c))(jnp.arange(4))

    def body(state, _):
        state, info = jax.vmap(kern.step, in_axes=(0, None))(state, None)
        return state, (info.num_steps, info.turning, info.diverging)

    run = jax.jit(lambda s: jax.lax.scan(body, s, None, length=50)[1])
    n, turning, div = map(np.asarray, run(kern.init(z0, keys, None)))
    assert not div.any() and set(np.unique(turning)) <= {0.0, 1.0}
    assert np.all(turning[n < 2 ** depth - 1] == 1.0)  # a tree stopped short turned
    assert uturns[0] <= turning.mean() <= uturns[1], turning.mean()
    if depth == 5:
        assert np.all(n == 31)


@pytest.mark.parametrize("kernel", ["nuts", "hmc", "mclmc", "adjusted_mclmc"])
def test_a_fresh_state_is_placed_as_a_restored_one(kernel):
    """The chains' init places every leaf of its state exactly as ``kernel.template`` (what a
    checkpoint is restored onto) says: the chunk program then lowers the same for a fresh run and
    a resumed one, and a resume reads it from the compilation cache. A key left sharded like the
    field on a 1 x 1 mesh once made every resume compile it again (docs/benchmarks.md)."""
    from fli.infer.sample.kernels import make_kernel
    from fli.sim.sharding import make_mesh

    target = Gaussian(make_mesh((1, 1)))
    lay = target.layout
    kern = make_kernel(target, "sharded", kernel=kernel, num_warmup=4, step_size=0.1)
    zsh = jax.NamedSharding(lay.mesh, jax.P(None, *lay.sharding.spec))
    z0 = jax.device_put(jnp.zeros((2, lay.size)), zsh)
    keys = jax.vmap(lambda c: jax.random.fold_in(jax.random.PRNGKey(0), c))(jnp.arange(2))
    state = kern.init(z0, keys, None)
    template = kern.template(jax.ShapeDtypeStruct(z0.shape, z0.dtype, sharding=zsh), keys, None)
    got, want = jax.tree_util.tree_leaves_with_path(state), jax.tree.leaves(template)
    assert len(got) == len(want)
    for (path, x), t in zip(got, want, strict=True):
        if isinstance(x, jax.Array):
            assert x.sharding == t.sharding, (jax.tree_util.keystr(path), x.sharding, t.sharding)


def test_the_sharded_kernel_follows_stock_numpyro_nuts_draw_for_draw():
    """Same key, same start, same warm-up: the sharded kernel (8 devices, its float64 kinetic
    sums) and NumPyro's NUTS as shipped (one device, its own kinetic energy) take the same
    trees to the same points, in float64.

    Why float64: in float32 the sharded sums (local sums, then one all-reduce) round H ~ D/2
    differently from one device's sum, by ~1e-4; the acceptance probabilities then differ by
    ~1e-5 and the dual averaging carries that into the step size, so the chains part by more
    than round-off within the warm-up (measured). In float64 the same reordering is ~1e-13,
    and the trees must agree exactly; positions to 1e-8 (the NUTS issue's criterion across
    layouts). The float32 kernel is checked in distribution below.
    """
    from numpyro.infer.hmc import hmc

    from fli.sim.sharding import make_mesh

    n_warm, n = 20, 30
    with jax.enable_x64(True):
        target = Gaussian(make_mesh((2, 4)))
        lay = target.layout
        z0 = jax.device_put(0.3 * jax.random.normal(jax.random.PRNGKey(5), (lay.size,), jnp.float64), lay.sharding)
        key = jax.random.PRNGKey(7)
        zs, steps, depth = _sharded_chain(target, z0[None], key[None], n_warm, n)
        assert tuple(zs.sharding.spec)[2:] == tuple(lay.sharding.spec)  # the positions stayed sharded

        init_k, sample_k = hmc(potential_fn=lambda z: target.potential_flat(z, None), algo="NUTS")
        z1 = jax.device_put(np.asarray(z0), jax.devices()[0])
        ref = init_k(z1, n_warm, step_size=0.1, inverse_mass_matrix=jnp.ones(lay.size, jnp.float64),
                     adapt_step_size=True, adapt_mass_matrix=True, dense_mass=False, target_accept_prob=0.8,
                     max_tree_depth=5, rng_key=key)

        def stock(s, _):
            s = sample_k(s)
            return s, (s.z, s.num_steps)

        zr, steps_r = jax.jit(lambda s: jax.lax.scan(stock, s, None, length=n)[1])(ref)
        assert zs.dtype == zr.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(steps)[:, 0], np.asarray(steps_r))
    assert len(set(np.asarray(depth).ravel().tolist())) > 1  # the trees differ from draw to draw: a real check
    np.testing.assert_allclose(np.asarray(zs)[:, 0], np.asarray(zr), atol=1e-8)


@pytest.mark.slow(seconds=15)  # (350 transitions of 8 chains): the default suite ran 686 s with it, cold
def test_the_float32_sharded_kernel_draws_the_gaussian_target():
    """The float32 kernel on 8 devices, 8 vectorised chains from over-dispersed starts, on
    independent normals of known scales: the draws' means and variances agree with the
    target's within their Monte Carlo errors (ArviZ's ESS), and the draws thinned to the
    ESS pass a Kolmogorov-Smirnov test against the standard normal once standardised.

    Bounds: each entry's mean, divided by its Monte Carlo standard error, is ~N(0, 1), so the
    mean square over the 272 entries is 1 +- 0.09 (measured: 1.22, NUTS's ESS exceeds the
    draws here, and such ESS estimates run high); [0.6, 1.6] leaves room for the ESS
    estimate's own error (~10-20 %). Variances: each entry's var / scale^2 has relative error
    ~sqrt(2 / ESS) ~ 0.1, and the mean over the entries, which are independent, ~0.004;
    0.03 covers the ESS's error and the correlation between var and ESS estimates.
    The KS test at level 0.001 (measured p = 0.97; scales 5 % off give p < 1e-10): a
    failure is then an error, not chance.
    """
    import arviz as az
    from scipy import stats

    from fli.sim.sharding import make_mesh

    n_chains, n_warm, n = 8, 150, 200
    target = Gaussian(make_mesh((2, 4)))
    lay = target.layout
    z0 = 2.0 * jax.random.normal(jax.random.PRNGKey(1), (n_chains, lay.size))
    z0 = jax.device_put(z0, jax.NamedSharding(lay.mesh, jax.P(None, *lay.sharding.spec)))
    keys = jax.vmap(lambda c: jax.random.fold_in(jax.random.PRNGKey(2), c))(jnp.arange(n_chains))
    zs, _, _ = _sharded_chain(target, z0, keys, n_warm, n_warm + n)
    draws = np.asarray(zs)[n_warm:].transpose(1, 0, 2)  # [chain, draw, entry]
    scale = np.asarray(target.scales())
    ess = az.ess(az.convert_to_dataset({"z": draws}))["z"].values  # bulk ESS per entry
    assert ess.min() > 100, ess.min()
    mean, var = draws.mean((0, 1)), draws.var((0, 1))
    mcse = np.sqrt(var / ess)
    assert 0.6 < np.mean((mean / mcse) ** 2) < 1.6, np.mean((mean / mcse) ** 2)
    assert abs(np.mean(var / scale**2) - 1.0) < 0.03, np.mean(var / scale**2)
    thin = int(np.ceil(n * n_chains / ess.min()))
    x = (draws[:, ::thin, :] / scale).ravel()
    assert stats.kstest(x, "norm").pvalue > 1e-3
