"""The sampler seam: one small interface between a kernel and everything around it.

``fli-nuts`` (:mod:`fli.infer.nuts`) drives a kernel through three calls and never looks
inside its state:

* ``init(z0, keys, data) -> state``: the states of ``C`` chains at the flat latents
  ``z0 [C, size]`` (:mod:`fli.infer.layout`), one key each, warm-up included in the state;
  every leaf has the chain axis first;
* ``step(state, data) -> (state, StepInfo)``: one transition of ONE chain, traceable: the
  chunk loop ``jax.vmap`` s it over the chains and scans it; :class:`StepInfo` holds the
  scalars every kernel reports;
* ``latents(state)``: one chain's ``(theta, s)``; ``state_template(...)``: the state's shapes,
  dtypes and shardings, the target a checkpoint is restored onto.

Several chains in one run (``inference.chains_per_run``) are NumPyro's "vectorized" chain
method: one program advances all of them, each with its own step size, mass matrix and key.
A vmapped ``while_loop`` runs until the longest tree of the step is built, so a draw costs the
deepest chain's trajectory; in return the forward model's small operations are batched
(docs/benchmarks.md measures the trade).

The state is a pytree of arrays, so the chunk loop checkpoints it with orbax as it is. The
kernel here is NumPyro's (its functional ``hmc`` API: NUTS or HMC, dual-averaging step size
and a diagonal mass matrix adapted on NumPyro's windowed schedule). The issue after fli-nuts
replaces it with a kernel whose state stays sharded; only this module changes.

Energies: NumPyro keeps the position, momentum and energies in one dtype, so the potential and
the kinetic energy are float32 results of float64 sums, with the offset
:attr:`~fli.infer.model.Posterior.energy_offset` (potential) and D/2 (kinetic) taken off
before the one rounding (:mod:`fli.infer.energy`). Energies reported are therefore
``H - offset``; differences, which are all that sampling and E-BFMI read, are unchanged.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fli.config import SAMPLERS
from fli.infer.energy import offset_sum
from fli.infer.layout import FLAT_SPEC
from fli.infer.model import Data, Posterior

KERNELS = ("nuts", "hmc")


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


class NumpyroKernel:
    """NumPyro's NUTS or HMC on :meth:`Posterior.potential_flat` (precise energies): the
    ``sharded`` sampler. Its latent is the flat layout, one vector whose every device slice is
    that device's field block and a tail, so every state vector NumPyro builds from it (momentum,
    gradient, mass matrix, Welford moments, the tree's states and momentum sums) is sharded the
    same way and its inner products are local sums and one all-reduce of a scalar
    (tests/infer/test_sampler.py reads the compiled step).

    Args:
        post: the posterior; its flat layout is the latent.
        kernel: ``"nuts"`` or ``"hmc"``.
        num_warmup: warm-up transitions (step size and diagonal mass matrix adapted).
        target_accept: dual averaging's target acceptance probability, in (0, 1).
        max_tree_depth: NUTS's largest tree depth.
        num_steps: HMC's leapfrog steps per trajectory.
        step_size: the first step size (dual averaging starts from a heuristic search around it).
    """

    def __init__(self, post: Posterior, kernel: str = "nuts", num_warmup: int = 100, target_accept: float = 0.8,
                 max_tree_depth: int = 6, num_steps: int = 16, step_size: float = 0.1):
        from numpyro.infer.hmc import hmc  # noqa: PLC0415

        if kernel not in KERNELS:
            raise ValueError(f"inference.kernel must be one of {KERNELS}, got {kernel!r}")
        self.post, self.kernel, self.num_warmup = post, kernel, int(num_warmup)
        self.target_accept, self.max_tree_depth = float(target_accept), int(max_tree_depth)
        self.num_steps, self.step_size = int(num_steps), float(step_size)
        self.layout = post.layout
        self._init_kernel, self._sample_kernel = hmc(potential_fn_gen=self._potential_gen,
                                                     kinetic_fn=kinetic_energy(self.dim, pytree=self.pytree),
                                                     algo="NUTS" if kernel == "nuts" else "HMC")
        self._traced_init = False

    # -- the seam -------------------------------------------------------------------------
    def init(self, z0, keys, data: Data):
        """The states of the chains at ``z0 [C, size]`` with ``keys [C, 2]`` (jitted; placed
        with :meth:`shardings`)."""
        init = self._chains_init
        fn = jax.jit(init, out_shardings=self.shardings(jax.eval_shape(init, z0, keys, data)))
        self._traced_init = True
        return fn(z0, keys, data)

    def step(self, state, data: Data):
        """One transition; returns ``(state, StepInfo)`` (traceable)."""
        if not self._traced_init:  # NumPyro's sample_kernel reads what init_kernel set up
            jax.eval_shape(self._init_fn, jax.ShapeDtypeStruct(state.z.shape, state.z.dtype),
                           jax.ShapeDtypeStruct(state.rng_key.shape, state.rng_key.dtype), data)
            self._traced_init = True
        new = self._sample_kernel(state, model_args=(data,))
        new = jax.lax.with_sharding_constraint(new, self.shardings(new))
        depth = tree_depth(new.num_steps) if self.kernel == "nuts" else jnp.zeros((), jnp.int32)
        info = StepInfo(new.potential_energy, new.energy, new.diverging, new.num_steps, depth, new.accept_prob,
                        new.mean_accept_prob, new.adapt_state.step_size)
        return new, info

    # what differs between the layouts
    pytree = False  # the latent NumPyro sees is one flat vector
    layout_dependent = True  # its order depends on pdims: a checkpoint is reordered on another layout

    @property
    def dim(self) -> int:
        """Length of the latent NumPyro sees (the kinetic energy's offset is half of it)."""
        return self.layout.size

    def _potential_gen(self, data):
        return lambda z: self.post.potential_flat(z, data, precise=True)

    def _latent(self, flat):
        return flat

    def _unit_mass(self, dtype):
        return jax.lax.with_sharding_constraint(jnp.ones((self.layout.size,), dtype), self.layout.sharding)

    def latents(self, state):
        """``(theta, s)`` of one chain's state (traceable)."""
        return self.layout.unpack(state.z)

    @staticmethod
    def iteration(state):
        """Transitions done (warm-up included)."""
        return state.i

    def state_template(self, z0, keys, data: Data):
        """``ShapeDtypeStruct`` s with shardings (``z0 [C, size]``, ``keys [C, 2]``): the
        target to restore a checkpoint onto."""
        shapes = jax.eval_shape(self._chains_init, z0, keys, data)
        self._traced_init = True
        shard = self.shardings(shapes)
        return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh) if hasattr(s, "shape")
                            else s, shapes, shard)

    def shardings(self, tree):
        """Every flat-latent-sized vector sharded like the latent (a leading chain axis, where
        there is one, unsharded), everything else replicated."""
        mesh, size = self.layout.mesh, self.layout.size
        rep = NamedSharding(mesh, P())

        def one(x):
            shape = tuple(np.shape(x))  # np.shape: HMC's state holds Python scalars beside the arrays
            if shape and shape[-1] == size and len(shape) <= 2:
                return NamedSharding(mesh, P(*([None] * (len(shape) - 1)), *FLAT_SPEC))
            return rep

        return jax.tree.map(one, tree)

    # -- internals ------------------------------------------------------------------------
    def _chains_init(self, z0, keys, data):
        return jax.vmap(self._init_fn, in_axes=(0, 0, None))(z0, keys, data)

    def _init_fn(self, z0, key, data):
        imm = self._unit_mass(z0.dtype)
        kw = dict(num_steps=self.num_steps) if self.kernel == "hmc" else dict(max_tree_depth=self.max_tree_depth)
        return self._init_kernel(self._latent(z0), self.num_warmup, step_size=self.step_size, inverse_mass_matrix=imm,
                                 adapt_step_size=True, adapt_mass_matrix=True, dense_mass=False,
                                 target_accept_prob=self.target_accept, model_args=(data,), rng_key=key, **kw)


class StockKernel(NumpyroKernel):
    """NumPyro's NUTS or HMC on NumPyro's own flattening of the latents: the ``numpyro``
    sampler, kept to measure the sharded one against (docs/benchmarks.md).

    The latent is the pytree ``Latents(theta, s)``; NumPyro ravels it wherever it needs one
    vector (mass matrix, kinetic energy, U-turn test, the tree's momentum checkpoints), and
    that ravel concatenates the replicated scalars with the sharded field: the field is
    gathered inside every leapfrog step. Same potential, same precise energies, same schedule.
    """

    pytree = True
    layout_dependent = False  # a global pytree and vectors in ravel order: any layout reads them

    @property
    def dim(self) -> int:
        return self.post.dim

    def _potential_gen(self, data):
        return lambda lat: self.post.potential(lat, data, precise=True)

    def _latent(self, flat):
        from fli.infer.model import Latents  # noqa: PLC0415

        return Latents(*self.layout.unpack(flat))

    def _unit_mass(self, dtype):
        return jnp.ones((self.post.dim,), dtype)

    def latents(self, state):
        return state.z.theta, state.z.s

    def shardings(self, tree):
        """Field-shaped leaves (a leading chain axis unsharded) sharded like the field;
        everything else replicated."""
        from fli.sharding import field_leaf_shardings  # noqa: PLC0415

        return field_leaf_shardings(tree, self.layout.mesh, self.layout.shape)


def make_kernel(post: Posterior, sampler: str = "sharded", **kw) -> NumpyroKernel:
    """The kernel of ``inference.sampler``: ``sharded`` or ``numpyro``."""
    if sampler not in SAMPLERS:
        raise ValueError(f"inference.sampler must be one of {SAMPLERS}, got {sampler!r}")
    return (NumpyroKernel if sampler == "sharded" else StockKernel)(post, **kw)
