"""The sampler seam: a kernel is data, a small NamedTuple of pure functions.

The run loop (:mod:`fli.infer.sample.run`) and the chunk program (:mod:`fli.infer.sample.chunk`)
drive a :class:`Kernel` through its functions and never look inside its state:

* ``init(z0, keys, data) -> state``: ``C`` chains at the flat latents ``z0 [C, size]``
  (:mod:`fli.infer.posterior.layout`), one key each, warm-up included; every leaf has the chain
  axis first (a pytree of arrays, which the run loop checkpoints as it is);
* ``step(state, data) -> (state, StepInfo)``: one transition of ONE chain, traceable; the chunk
  program ``jax.vmap`` s it over the chains and scans it; :class:`StepInfo` holds the scalars
  every kernel reports;
* ``latents(state)``: one chain's ``(theta, s)``; ``template(...)``: the state's shapes, dtypes
  and shardings, the target a checkpoint is restored onto.

How the kernel sees the latent (one flat sharded vector, or NumPyro's pytree) is a
:class:`LatentLayout` passed to its factory. The kernel here is NumPyro's functional ``hmc`` (NUTS
or HMC, dual-averaging step size, a diagonal mass matrix on NumPyro's windowed schedule); a kernel
with another warm-up brings its own ``init`` and ``step`` and keeps its tuning in its state.
Vectorised chains cost the deepest chain's tree a draw (docs/nuts.md, "Many chains"). Energies
are float64 sums rounded once to float32 after an offset is taken off, so they read ``H - offset``
(:attr:`~fli.infer.posterior.model.Posterior.energy_offset`, :mod:`fli.infer.posterior.energy`;
docs/nuts.md, "The latent, the kernel and its energies").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fli.infer.posterior.energy import offset_sum
from fli.infer.posterior.layout import FLAT_SPEC
from fli.infer.posterior.model import Posterior


class StepInfo(NamedTuple):
    """What one transition reports (scalars, replicated)."""

    potential_energy: Any
    energy: Any
    diverging: Any
    num_steps: Any
    tree_depth: Any
    accept_prob: Any
    mean_accept_prob: Any
    step_size: Any
    energy_error: Any  # MCLMC: the step's energy error / sqrt(dimension); NaN for NUTS and HMC
    turning: Any  # NUTS: 1.0 if a U-turn ended the tree, 0.0 if not (the depth cap, or a divergence); NaN otherwise


@contextlib.contextmanager
def _recording_trees(record: list):
    """While tracing NumPyro's NUTS transition, append each tree it builds (its ``TreeInfo``:
    ``turning``, ``diverging``, ...) to ``record``. NumPyro's state keeps the tree's length but
    not why it ended, and a tree of the largest depth has the same length whether the depth cap
    or a U-turn at its last doubling ended it. ``numpyro.infer.hmc`` calls ``build_tree`` by
    its module's name, so the name is wrapped for the trace and restored after it."""
    import numpyro.infer.hmc as nhmc  # noqa: PLC0415

    original = nhmc.build_tree

    def build_tree(*args, **kwargs):
        tree = original(*args, **kwargs)
        record.append(tree)
        return tree

    nhmc.build_tree = build_tree
    try:
        yield
    finally:
        nhmc.build_tree = original


def tree_depth(num_steps):
    """NUTS tree depth from the number of leapfrog steps: a depth-d tree takes up to 2^d - 1."""
    n = jnp.asarray(num_steps, jnp.float32)
    return jnp.ceil(jnp.log2(n + 1.0) - 1e-6).astype(jnp.int32)


def kinetic_energy(size: int, precise: bool = True, pytree: bool = False):
    """NumPyro ``kinetic_fn`` of a diagonal mass matrix on ``size`` latents: ``0.5 r M^-1 r``,
    minus ``size/2`` and summed in float64 when ``precise`` (see the module docstring).
    ``pytree``: the momentum is a pytree, raveled first (NumPyro's own layout)."""
    from jax.flatten_util import ravel_pytree  # noqa: PLC0415

    def kinetic(inverse_mass_matrix, r):
        if pytree:
            r, _ = ravel_pytree(r)
        if not precise:
            return 0.5 * jnp.sum(inverse_mass_matrix * r * r)
        return offset_sum(0.5 * inverse_mass_matrix * r * r, 0.5 * size)

    def grad(inverse_mass_matrix, r):  # diagonal mass: M^-1 r
        if not pytree:
            return inverse_mass_matrix * r
        flat, unravel = ravel_pytree(r)
        return unravel(inverse_mass_matrix * flat)

    kinetic._kinetic_grad = grad
    return kinetic


class LatentLayout(NamedTuple):
    """How a kernel sees the latent, as a value: which vector NumPyro integrates and how its
    state is placed.

    ``sharded`` (:func:`sharded_latent`): the flat layout of :mod:`fli.infer.posterior.layout`, one
    vector whose every device slice is that device's field block and a tail, so every state
    vector NumPyro builds from it (momentum, gradient, mass matrix, Welford moments, the tree's
    states and momentum sums) is sharded the same way and its inner products are local sums
    and one all-reduce of a scalar (tests/infer/sample/test_base.py reads the compiled step).

    ``numpyro`` (:func:`numpyro_latent`): the pytree ``Latents(theta, s)``, which NumPyro ravels
    wherever it needs one vector (mass matrix, kinetic energy, U-turn test, the tree's momentum
    checkpoints); that ravel concatenates the replicated scalars with the sharded field, so the
    field is gathered inside every leapfrog step. Kept to measure the sharded one against
    (docs/benchmarks.md). Same potential, same precise energies, same schedule.
    """

    name: str
    dim: int  # length of the vector NumPyro sees (the kinetic energy's offset is half of it)
    pytree: bool  # the latent is a pytree, raveled by NumPyro
    layout_dependent: bool  # its order depends on pdims: a checkpoint is reordered on another layout
    # data -> (latent -> U - offset, precise). It calls one jitted function of (latent, data):
    # the kernels differentiate it at several places of one program (NumPyro's init, its base
    # tree and its subtree loop; MCLMC's integrator), and JAX caches a jitted function's trace
    # and its linearisation, so the posterior is traced once per process instead of at each
    # (4.9 s a trace of the small posterior's gradient; docs/benchmarks.md)
    potential_gen: Callable
    to_latent: Callable  # a flat latent [size] -> the latent NumPyro sees
    unit_mass: Callable  # dtype -> ones [dim], placed
    latents: Callable  # (one chain's state, data) -> (theta, s)
    shardings: Callable  # a state pytree (chain axis first or not) -> its shardings


def sharded_latent(post: Posterior) -> LatentLayout:
    """The ``sharded`` latent: ``post``'s flat layout (needs ``post.layout`` and
    ``post.potential_flat``)."""
    lay = post.layout
    mesh, size = lay.mesh, lay.size
    rep = NamedSharding(mesh, P())

    def shardings(tree):
        """Every flat-latent-sized vector sharded like the latent (a leading chain axis,
        where there is one, unsharded), everything else replicated."""

        def one(x):
            shape = tuple(np.shape(x))  # np.shape: HMC's state holds Python scalars beside the arrays
            if shape and shape[-1] == size and len(shape) <= 2:
                return NamedSharding(mesh, P(*([None] * (len(shape) - 1)), *FLAT_SPEC))
            return rep

        return jax.tree.map(one, tree)

    potential = jax.jit(lambda z, data: post.potential_flat(z, data, precise=True))  # traced once: see below
    return LatentLayout(
        name="sharded", dim=size, pytree=False, layout_dependent=True,
        potential_gen=lambda data: lambda z: potential(z, data),
        to_latent=lambda flat: flat,
        unit_mass=lambda dtype: jax.lax.with_sharding_constraint(jnp.ones((size,), dtype), lay.sharding),
        latents=lambda state, data: lay.unpack(state.z),
        shardings=shardings)


def numpyro_latent(post: Posterior) -> LatentLayout:
    """The ``numpyro`` latent: the pytree ``Latents(theta, s)``; a global pytree and vectors
    in ravel order, so any device layout reads its checkpoints."""
    from fli.infer.posterior.model import Latents  # noqa: PLC0415
    from fli.sim.sharding import field_leaf_shardings  # noqa: PLC0415

    lay = post.layout
    potential = jax.jit(lambda lat, data: post.potential(lat, data, precise=True))  # traced once: see LatentLayout
    return LatentLayout(
        name="numpyro", dim=post.dim, pytree=True, layout_dependent=False,
        potential_gen=lambda data: lambda lat: potential(lat, data),
        to_latent=lambda flat: Latents(*lay.unpack(flat)),
        unit_mass=lambda dtype: jnp.ones((post.dim,), dtype),
        latents=lambda state, data: (state.z.theta, state.z.s),
        shardings=lambda tree: field_leaf_shardings(tree, lay.mesh, lay.shape))


LATENTS = {"sharded": sharded_latent, "numpyro": numpyro_latent}


class Kernel(NamedTuple):
    """A kernel as data: pure functions over a NamedTuple state (every leaf with the chain
    axis first where a function says ``chains``).

    Attributes:
        name: ``"nuts"`` or ``"hmc"``.
        latent: the :class:`LatentLayout` it samples.
        init: ``(z0 [C, size], keys [C, 2], data) -> state`` of ``C`` chains (jitted, placed).
        step: ``(state, data) -> (state, StepInfo)``: one transition of one chain (traceable;
            needs no ``init`` in this process, so it runs on a restored state).
        latents: ``(one chain's state, data) -> (theta, s)`` (traceable; ``data`` is what
            ``step`` reads, which holds a preconditioner where the latent has one).
        iteration: one chain's state -> transitions done, warm-up included.
        template: ``(z0, keys, data) -> `` the state's ``ShapeDtypeStruct`` s with shardings,
            the target a checkpoint is restored onto (``z0``, ``keys`` may be abstract).
        shardings: a state pytree -> its shardings.
    """

    name: str
    latent: LatentLayout
    init: Callable
    step: Callable
    latents: Callable
    iteration: Callable
    template: Callable
    shardings: Callable

    @property
    def dim(self) -> int:
        return self.latent.dim

    @property
    def layout_dependent(self) -> bool:
        return self.latent.layout_dependent


def _place(x, sharding):
    """``x`` with exactly ``sharding`` (a jitted copy, which any process layout allows), where it is
    an array placed otherwise; anything else as it is."""
    if not isinstance(x, jax.Array) or x.sharding == sharding:
        return x
    return jax.jit(lambda a: a, out_shardings=sharding)(x)


def chains_of(init_one: Callable, latent: LatentLayout):
    """A kernel's ``init`` and ``template`` from its one-chain ``init_one(z0, key, data)``: the
    chains' states vmapped, jitted and placed by ``latent.shardings``. One jitted function serves
    both, so that the posterior in ``init_one`` is traced once for the two (tracing, not
    compiling, is most of a kernel's start: a trace of the small posterior's gradient took 2-5 s;
    see docs/benchmarks.md)."""

    def chains_init(z0, keys, data):
        states = jax.vmap(init_one, in_axes=(0, 0, None))(z0, keys, data)
        return jax.lax.with_sharding_constraint(states, latent.shardings(states))

    jitted = jax.jit(chains_init)

    def template(z0, keys, data):
        shapes = jax.eval_shape(jitted, z0, keys, data)
        return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh) if hasattr(s, "shape")
                            else s, shapes, latent.shardings(shapes))

    def init(z0, keys, data):
        # placed exactly as a restored state is (``template``): the sharding constraint alone
        # left a [chains, 2] key sharded like the field on a 1 x 1 mesh, an equivalent placement
        # but another lowering, so a resumed run missed the compilation cache and compiled its
        # chunk program again (86 s of a 119-s resume of the small mock)
        states = jitted(z0, keys, data)
        return jax.tree.map(_place, states, latent.shardings(states))

    return init, template


def numpyro_kernel(post: Posterior, latent: LatentLayout, kernel: str = "nuts", num_warmup: int = 100,
                   target_accept: float = 0.8, max_tree_depth: int = 6, num_steps: int = 16,
                   step_size: float = 0.1) -> Kernel:
    """NumPyro's NUTS or HMC (its functional ``hmc`` API, precise energies) on ``latent``.

    Args:
        post: the posterior (``latent`` was made from it).
        latent: :func:`sharded_latent` or :func:`numpyro_latent` of ``post``.
        kernel: ``"nuts"`` or ``"hmc"``.
        num_warmup: warm-up transitions (step size and diagonal mass matrix adapted).
        target_accept: dual averaging's target acceptance probability, in (0, 1).
        max_tree_depth: NUTS's largest tree depth.
        num_steps: HMC's leapfrog steps per trajectory.
        step_size: the first step size (dual averaging starts from a heuristic search around it).
    """
    from numpyro.infer.hmc import hmc  # noqa: PLC0415

    if kernel not in ("nuts", "hmc"):
        raise ValueError(f"NumPyro's kernels are 'nuts' and 'hmc', got {kernel!r}")
    num_warmup, num_steps, max_tree_depth = int(num_warmup), int(num_steps), int(max_tree_depth)
    init_kernel, sample_kernel = hmc(potential_fn_gen=latent.potential_gen,
                                     kinetic_fn=kinetic_energy(latent.dim, pytree=latent.pytree),
                                     algo="NUTS" if kernel == "nuts" else "HMC")
    size = post.layout.size

    traced = []  # init_one has been traced in this process (and so NumPyro's closures are set)

    @jax.jit
    def init_one(z0, key, data):
        traced.append(True)
        kw = dict(num_steps=num_steps) if kernel == "hmc" else dict(max_tree_depth=max_tree_depth)
        return init_kernel(latent.to_latent(z0), num_warmup, step_size=float(step_size),
                           inverse_mass_matrix=latent.unit_mass(z0.dtype), adapt_step_size=True,
                           adapt_mass_matrix=True, dense_mass=False, target_accept_prob=float(target_accept),
                           model_args=(data,), rng_key=key, **kw)

    init, template = chains_of(init_one, latent)

    def step(state, data):
        # NumPyro's sample_kernel reads settings (tree depth, adaptation schedule) that its
        # init_kernel sets in closures; tracing init's shapes first, unless this process has
        # (a trace of the posterior's gradient, seconds), makes step work on any state, e.g. one
        # restored from a checkpoint in a process that never called init
        if not traced:
            dtype = jax.tree.leaves(state.z)[0].dtype
            jax.eval_shape(init_one, jax.ShapeDtypeStruct((size,), dtype),
                           jax.ShapeDtypeStruct(state.rng_key.shape, state.rng_key.dtype), data)
        trees: list = []
        with _recording_trees(trees):
            new = sample_kernel(state, model_args=(data,))
        new = jax.lax.with_sharding_constraint(new, latent.shardings(new))
        depth = tree_depth(new.num_steps) if kernel == "nuts" else jnp.zeros((), jnp.int32)
        dt = jnp.result_type(new.potential_energy)
        if kernel == "nuts" and len(trees) != 1:
            raise RuntimeError(f"NumPyro's NUTS built {len(trees)} trees in one transition's trace; fli expects 1")
        turning = trees[0].turning.astype(dt) if kernel == "nuts" else jnp.full((), jnp.nan, dt)
        info = StepInfo(new.potential_energy, new.energy, new.diverging, new.num_steps, depth, new.accept_prob,
                        new.mean_accept_prob, new.adapt_state.step_size, jnp.full((), jnp.nan, dt), turning)
        return new, info

    return Kernel(name=kernel, latent=latent, init=init, step=step, latents=latent.latents,
                  iteration=lambda state: state.i, template=template, shardings=latent.shardings)
