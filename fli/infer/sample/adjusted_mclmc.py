"""Metropolis-adjusted MCLMC (Robnik, Cohn-Gordon & Seljak 2025, arXiv:2503.01707) on the flat
sharded latent: MCLMC's isokinetic dynamics (:mod:`fli.infer.sample.mclmc`) as a proposal, corrected
by a Metropolis test, so that its draws are exact for any step size.

A transition draws a fresh velocity uniformly on the unit sphere, integrates ``n`` steps with no
refresh, and accepts the end point with probability ``min(1, exp(-dE))``, ``dE`` the potential's
change plus the kinetic terms of :func:`~fli.infer.sample.mclmc.velocity_update` (the flow with its
velocity reversed is its own inverse; the kinetic term is its phase-space volume change). ``n`` is
uniform in ``1 .. 2 L / eps`` (at most :data:`MAX_STEPS`): the mean trajectory is ``L`` long and no
fixed length resonates with the target. An energy error that is not finite or exceeds
:data:`DIVERGED` is a rejected divergence.

The warm-up tunes, inside the state, ``L`` as MCLMC does
(:func:`~fli.infer.sample.mclmc.variance_length`) and the step size by dual averaging to
``inference.target_accept``, twice: NumPyro's over the first half (centred on 10x the first step,
``gamma = 0.05``), then again from its average with ``gamma =`` :data:`SECOND_GAMMA`, whose average
is the step kept. One dual averaging throughout left the acceptance after the warm-up well above
its target (the iterates' spread lowers the warm-up's acceptance): docs/benchmarks.md, "Adjusted
MCLMC's step size: dual averaging restarted for the warm-up's second half".
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fli.infer.sample.mclmc import INTEGRATORS, integrate, variance_length
from fli.infer.sample.base import Kernel, LatentLayout, StepInfo, chains_of

MAX_STEPS = 256  # integrator steps of one trajectory, at most (the warm-up's first L / eps is large)
DIVERGED = 1000.0  # an energy error beyond this is a divergence
SECOND_GAMMA = 0.2  # dual averaging's gamma over the warm-up's second half (NumPyro's default 0.05 first)


class AdjustedState(NamedTuple):
    """One chain's state (a leading chain axis where several are held)."""

    z: Any  # position, the flat latent [size]
    potential: Any  # U(z) - energy offset (precise)
    grad: Any  # dU/dz [size]
    rng_key: Any
    i: Any  # transitions done, warm-up included (int32)
    step_size: Any
    L: Any  # mean trajectory length
    da: Any  # NumPyro's dual-averaging state of log(step size)
    n_z: Any  # the warm-up's second half: Welford count, mean and squared deviations of z
    mean_z: Any
    m2_z: Any


def adjusted_mclmc_kernel(post, latent: LatentLayout, num_warmup: int = 100, step_size: float = 0.1,
                          target_accept: float = 0.9, integrator: str = "mclachlan") -> Kernel:
    """Adjusted MCLMC on ``latent`` (the sharded flat latent), its step size tuned to
    ``target_accept`` and its trajectory length to the target's scales over ``num_warmup``
    transitions, from the first step size ``step_size``."""
    from numpyro.infer.hmc_util import dual_averaging  # noqa: PLC0415

    if latent.pytree:
        raise ValueError("inference.kernel=adjusted_mclmc runs on the flat latent: set inference.sampler=sharded")
    if integrator not in INTEGRATORS:
        raise ValueError(f"inference.integrator must be one of {tuple(INTEGRATORS)}, got {integrator!r}")
    num_warmup, d, target = int(num_warmup), int(latent.dim), float(target_accept)
    n_grads = len(INTEGRATORS[integrator][1])
    half = num_warmup // 2
    da_init, da_update = dual_averaging()
    da2_init, da2_update = dual_averaging(gamma=SECOND_GAMMA)

    def value_and_grad(data):
        return jax.value_and_grad(latent.potential_gen(data))

    def init_one(z0, key, data):
        U, g = value_and_grad(data)(z0)
        f = lambda x: jnp.asarray(x, z0.dtype)
        da = jax.tree.map(f, da_init(jnp.log(10.0 * step_size)))  # NumPyro's centre: 10x the first step
        return AdjustedState(z0, U, g, key, jnp.zeros((), jnp.int32), f(step_size), f(jnp.sqrt(d)), da,
                             jnp.zeros((), jnp.int32), jnp.zeros_like(z0), jnp.zeros_like(z0))

    init, template = chains_of(init_one, latent)

    def step(state, data):
        key, k_u, k_n, k_a = jax.random.split(state.rng_key, 4)
        eps, dtype = state.step_size, state.z.dtype
        u = jax.random.normal(k_u, state.z.shape, dtype)
        u = u / jnp.sqrt(jnp.sum(u * u))
        n = jnp.clip(jnp.ceil(2.0 * jax.random.uniform(k_n, (), dtype) * state.L / eps), 1, MAX_STEPS)
        n = n.astype(jnp.int32)
        vg = value_and_grad(data)

        def body(_, c):
            z, u, U, g, dE = c
            z, u, U, g, e = integrate(vg, z, u, U, g, eps, d, integrator)
            return z, u, U, g, dE + e

        z, _, U, g, dE = jax.lax.fori_loop(0, n, body, (state.z, u, state.potential, state.grad,
                                                        jnp.zeros((), state.potential.dtype)))
        ok = jnp.isfinite(dE) & jnp.isfinite(U)
        a = jnp.where(ok, jnp.exp(jnp.minimum(-jnp.where(ok, dE, 0.0), 0.0)), 0.0)  # min(1, exp(-dE))
        accept = jax.random.uniform(k_a, (), dtype) < a
        keep = lambda new, old: jnp.where(accept, new, old)
        z, U, g = keep(z, state.z), keep(U, state.potential), keep(g, state.grad)
        warm = state.i < num_warmup
        cast = lambda tree: jax.tree.map(lambda x, old: jnp.asarray(x, old.dtype), tree, state.da)
        restart = cast(da2_init(state.da[1]))  # centred on the first half's average log step
        at_half = (state.i == half) & (half > 0)  # a 1-transition warm-up keeps its one run
        second = cast(da2_update(target - a, jax.tree.map(lambda r, o: jnp.where(at_half, r, o), restart, state.da)))
        da = jax.tree.map(lambda f, g: jnp.where(state.i < half, f, g), cast(da_update(target - a, state.da)), second)
        da = jax.tree.map(lambda x, old: jnp.where(warm, jnp.asarray(x, old.dtype), old), da, state.da)
        last = warm & (state.i == num_warmup - 1)
        new_eps = jnp.where(warm, jnp.exp(jnp.where(last, da[1], da[0])), eps).astype(dtype)
        n_z, mean_z, m2_z, L = variance_length(warm & (state.i >= half), last, z, state.n_z, state.mean_z,
                                               state.m2_z, state.L)
        new = AdjustedState(z, U, g, key, state.i + 1, new_eps, L, da, n_z, mean_z, m2_z)
        new = jax.lax.with_sharding_constraint(new, latent.shardings(new))
        info = StepInfo(potential_energy=U, energy=jnp.full((), jnp.nan, U.dtype),
                        diverging=~ok | (jnp.where(ok, dE, 0.0) > DIVERGED), num_steps=n * n_grads,
                        tree_depth=jnp.zeros((), jnp.int32), accept_prob=a, mean_accept_prob=a, step_size=eps,
                        energy_error=jnp.where(ok, dE, jnp.nan) / jnp.sqrt(jnp.asarray(d, dtype)),
                        turning=jnp.full((), jnp.nan, U.dtype))
        return new, info

    return Kernel(name="adjusted_mclmc", latent=latent, init=init, step=step, latents=latent.latents,
                  iteration=lambda state: state.i, template=template, shardings=latent.shardings)
