"""The chunk program: ``n`` draws of every chain in one jitted call, and what it carries.

Each draw is one kernel ``step`` per chain (``jax.vmap`` over the chain axis), followed by the
draw's outputs: the parameters, the kernel's :class:`~fli.infer.sample.base.StepInfo`, the running
count of gradient evaluations, the spectra of :func:`fli.infer.posterior.summaries.draw_spectra` and the
largest particle displacement (checked against the halo after the chunk). The
white noise and kappa of every ``thin``-th draw are returned for ``fields.zarr``, and the
post-warm-up draws update Welford running moments of both (:class:`Accum`), checkpointed with
the kernel state. The program is compiled once per chunk length and donates its state.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fli.infer.posterior.model import Latents, Posterior
from fli.infer.sample.projections import project
from fli.infer.sample.base import Kernel, StepInfo
from fli.infer.posterior.summaries import draw_spectra
from fli.lensing.born import KAPPA_SPEC
from fli.sim.sharding import replicated_to_host


class Accum(NamedTuple):
    """Running statistics carried through the chunks (checkpointed with the kernel state); in
    the run's state every leaf has the chain axis first."""

    n: jax.Array  # post-warm-up draws counted (int32)
    mean_s: jax.Array  # white noise: Welford mean and sum of squared deviations
    m2_s: jax.Array
    mean_kappa: jax.Array  # noiseless convergence maps: the same
    m2_kappa: jax.Array
    grads: jax.Array  # gradient evaluations so far (int32), the start's included


class Draws(NamedTuple):
    """Per-draw outputs of a chunk (stacked: ``[n_draws, n_chains]``)."""

    params: dict
    info: StepInfo
    grads: jax.Array
    pk_s: jax.Array
    pk_lin: jax.Array
    proj: jax.Array  # the field's data-constrained projections [K] (fli.infer.sample.projections); [0] without
    max_disp: jax.Array  # the draw's largest transverse particle displacement, cells (0: no particles)


def _welford(acc: Accum, s, kappa, w) -> Accum:
    n = acc.n + w
    inv = jnp.where(n > 0, 1.0 / jnp.maximum(n, 1).astype(s.dtype), 0.0)
    ds = s - acc.mean_s
    mean_s = acc.mean_s + w * ds * inv
    m2_s = acc.m2_s + w * ds * (s - mean_s)
    dk = kappa - acc.mean_kappa
    mean_k = acc.mean_kappa + w * dk * inv
    m2_k = acc.m2_kappa + w * dk * (kappa - mean_k)
    return acc._replace(n=n, mean_s=mean_s, m2_s=m2_s, mean_kappa=mean_k, m2_kappa=m2_k)


def make_chunk(kernel: Kernel, post: Posterior, n: int, thin: int, num_warmup: int, kedges):
    """Jitted ``(state, acc, data, proj) -> (state, acc, Draws, fields)`` for ``n`` draws of every
    chain (``proj``: the projection vectors of :mod:`fli.infer.sample.projections`, or None; the state
    and ``acc`` have the chain axis first; each draw is ``jax.vmap`` ped over
    it); ``fields`` holds the white noise and kappa of every ``thin``-th draw
    (``[n // thin, n_chains, ...]``), or None when ``n < thin``."""
    grid = post.fwd.grid

    def one_chain(state, acc, data, proj):
        state, info = kernel.step(state, data)
        theta, s = kernel.latents(state, data)
        kappa, aux = post.predict(Latents(theta, s))
        w = (kernel.iteration(state) > num_warmup).astype(jnp.int32)
        acc = _welford(acc, s, kappa, w)
        acc = acc._replace(grads=acc.grads + info.num_steps.astype(jnp.int32))
        pk_s, pk_lin = draw_spectra(post, theta, s, kedges)
        p = project(proj, post.layout.pack(theta, s)) if proj is not None else jnp.zeros((0,), s.dtype)
        out = Draws(post.params(theta), info, acc.grads, pk_s, pk_lin, p, jnp.max(aux.max_disp))
        return state, acc, out, s, kappa

    s_sh = NamedSharding(grid.mesh, P(None, *grid.sharding.spec))
    k_sh = NamedSharding(grid.mesh, P(None, *KAPPA_SPEC))

    def one(carry, data, proj):
        state, acc, out, s, kappa = jax.vmap(one_chain, in_axes=(0, 0, None, None))(*carry, data, proj)
        return ((state, acc), out, jax.lax.with_sharding_constraint(s, s_sh),
                jax.lax.with_sharding_constraint(kappa, k_sh))

    def group(carry, data, proj, length):
        def body(c, _):
            c, out, s, kappa = one(c, data, proj)
            return c, (out, s, kappa)

        carry, (outs, ss, ks) = jax.lax.scan(body, carry, None, length=length)
        return carry, outs, ss[-1], ks[-1]

    def chunk(state, acc, data, proj=None):
        carry = (state, acc)
        outs, fields = [], None
        n_groups, tail = divmod(n, thin)
        if n_groups:
            def g(c, _):
                c, o, s, k = group(c, data, proj, thin)
                return c, (o, s, k)

            carry, (o, ss, ks) = jax.lax.scan(g, carry, None, length=n_groups)
            outs.append(jax.tree.map(lambda x: x.reshape(n_groups * thin, *x.shape[2:]), o))
            fields = (ss, ks)
        if tail:
            def t(c, _):
                c, o, _, _ = one(c, data, proj)
                return c, o

            carry, o = jax.lax.scan(t, carry, None, length=tail)
            outs.append(o)
        draws = outs[0] if len(outs) == 1 else jax.tree.map(lambda *x: jnp.concatenate(x), *outs)
        return carry[0], carry[1], draws, fields

    return jax.jit(chunk, donate_argnums=(0, 1))


def zero_accum(post: Posterior, chains: int = 1) -> Accum:
    """Empty running statistics for ``chains`` chains (chain axis first)."""
    g = post.fwd.grid
    ksh = NamedSharding(g.mesh, P(None, *KAPPA_SPEC))
    ssh = NamedSharding(g.mesh, P(None, *g.sharding.spec))
    rep = NamedSharding(g.mesh, P())

    def z():
        zs = jnp.zeros((chains, *g.shape), g.jdtype)
        zk = jnp.zeros((chains, *post.fwd.kappa_shape), g.jdtype)
        zi = jnp.zeros((chains,), jnp.int32)
        return Accum(zi, zs, zs, zk, zk, zi)

    return jax.jit(z, out_shardings=Accum(rep, ssh, ssh, ksh, ksh, rep))()


def take_chain(x, c: int, axis: int, spec):
    """Chain ``c`` of ``x`` along ``axis``: a sharded array stays where it is (``spec``: the
    slice's PartitionSpec), a host array is indexed."""
    if not isinstance(x, jax.Array):
        return np.take(np.asarray(x), c, axis=axis)
    mesh = x.sharding.mesh if isinstance(x.sharding, NamedSharding) else None
    if mesh is None:
        return np.take(replicated_to_host(x), c, axis=axis)
    return jax.jit(lambda a: jax.lax.index_in_dim(a, c, axis, keepdims=False),
                   out_shardings=NamedSharding(mesh, spec))(x)


def accum_of_chain(acc: Accum, c: int, grid) -> Accum:
    """Chain ``c``'s running statistics, each field where it lives."""
    s_spec, k_spec = grid.sharding.spec, KAPPA_SPEC
    host = replicated_to_host
    return Accum(host(acc.n)[c], take_chain(acc.mean_s, c, 0, s_spec), take_chain(acc.m2_s, c, 0, s_spec),
                 take_chain(acc.mean_kappa, c, 0, k_spec), take_chain(acc.m2_kappa, c, 0, k_spec),
                 host(acc.grads)[c])
