"""Microcanonical Langevin Monte Carlo (MCLMC, unadjusted) on the flat sharded latent.

Robnik, De Luca, Silverstein & Seljak 2023, arXiv:2212.08549. The velocity ``u`` stays on the
unit sphere and the position ``z`` moves at unit speed; the force ``-dU/dz`` turns ``u`` without
changing its length, and a partial refresh of ``u`` after each step (decay ``exp(-eps/L)``) makes
the chain ergodic. No Metropolis test: a finite step biases the draws, by an amount that the
energy error measures. :func:`velocity_update` is the closed-form update under a constant force,
written with ``exp(-delta)`` to be stable for any step; it returns the kinetic energy's change, so
a step's energy error is ``dU + dK``. :data:`INTEGRATORS`: the leapfrog (1 gradient) and
McLachlan's minimal-norm splitting (2 gradients, about 10x smaller error at the same step; the
default).

Every vector is the flat sharded latent of :mod:`fli.infer.posterior.layout`; the only non-local
operations are norms and inner products, a local sum and one all-reduce of a scalar each.

The warm-up (``i < num_warmup``) tunes, inside the state, the step size so that the energy error's
variance per dimension is ``energy_error`` (:data:`TARGET`), from an average of ``xi / eps^6``
restarted at the warm-up's half and three quarters, and ``L`` from the variances over its second
half (with ``tune_L="autocorrelation"``, from the autocorrelation of a few scalar
:func:`projections`). A divergence (``xi`` above :data:`DIVERGED`) is undone and shrinks the step
by :data:`SHRINK`, during the warm-up and for good after it. :class:`StepInfo`'s ``energy_error``
is divided by ``sqrt(d)``. Evidence: docs/nuts.md, "The latent, the kernel and its energies" and
"Notes moved from the code's docstrings"; docs/benchmarks.md.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fli.config import MCLMC_LENGTHS
from fli.infer.sample.autocorrelation import autocorrelation_time
from fli.infer.sample.base import Kernel, LatentLayout, StepInfo, chains_of

LAMBDA = 0.1931833275037836  # McLachlan's minimal-norm splitting (B lam A 1/2 B 1-2lam A 1/2 B lam)
INTEGRATORS = {
    # (velocity-update fractions, position-update fractions) of one step, alternating B A B ...
    "leapfrog": ((0.5, 0.5), (1.0,)),
    "mclachlan": ((LAMBDA, 1.0 - 2.0 * LAMBDA, LAMBDA), (0.5, 0.5)),
}
TARGET = 5e-6  # energy-error variance per dimension the warm-up aims at (1e-4 until 2026-12-05; docs/benchmarks.md)
DECAY = 0.95  # the first half of the warm-up's step-size average forgets a step over ~20 steps
SHRINK = 0.8  # step-size factor after a divergence (in the warm-up, and for good after it)
DIVERGED = 1e4  # xi = dE^2 / (d energy_error) beyond this (|dE| 100x the target's sd) is a divergence
MIN_STEP = 1e-5  # the step size is kept above it (eps^6 stays a normal float32)
WINDOW = 0.1  # the warm-up's last tenth sets L from the autocorrelation (tune_L="autocorrelation")
MIN_WINDOW = 20  # shorter windows keep the variance's L: too few steps for an autocorrelation time
LFACTOR = 0.4  # L = LFACTOR * eps * mean autocorrelation time (in steps), as BlackJAX's MCLMC tuner
N_SIGNS = 4  # random-sign projections of the whole position recorded beside the parameters


class MclmcState(NamedTuple):
    """One chain's state (a leading chain axis where several are held)."""

    z: Any  # position, the flat latent [size]
    u: Any  # unit velocity [size]
    potential: Any  # U(z) - energy offset (precise)
    grad: Any  # dU/dz [size]
    rng_key: Any
    i: Any  # transitions done, warm-up included (int32)
    step_size: Any
    L: Any  # trajectory length: the velocity's decay length of the partial refresh
    xi_avg: Any  # the warm-up's weighted average of xi / eps^6, and its weights
    w_avg: Any
    n_z: Any  # the warm-up's second half: Welford count, mean and squared deviations of z
    mean_z: Any
    m2_z: Any
    trace: Any  # the warm-up's last window: projections of z per transition [window, m] (replicated)


def _dot(a, b):
    return jnp.sum(a * b)


def velocity_update(u, grad, eps, d):
    """``u`` after a time ``eps`` under the constant force ``-grad`` on the unit sphere of
    ``d`` dimensions, and the kinetic-energy change ``dK``.

    With ``e`` the force's direction, ``ue = u . e`` and ``delta = eps |grad| / (d - 1)``, the
    component along ``e`` goes to ``tanh(delta + artanh(ue))`` and the rest shrinks by
    ``r = 2 zeta / D``, ``zeta = exp(-delta)``, ``D = 2 - (1 - ue)(1 - zeta^2)``;
    ``dK = -(d - 1) log r``."""
    g = jnp.sqrt(_dot(grad, grad))
    e = -grad / jnp.maximum(g, jnp.finfo(grad.dtype).tiny)
    ue = jnp.clip(_dot(u, e), -1.0, 1.0)
    delta = eps * g / (d - 1)
    zeta = jnp.exp(-delta)
    one_minus_z2 = -jnp.expm1(-2.0 * delta)
    D = 2.0 - (1.0 - ue) * one_minus_z2
    new = (e * (one_minus_z2 + ue * (1.0 - zeta) ** 2) + 2.0 * zeta * u) / D
    new = new / jnp.sqrt(_dot(new, new))
    dK = (d - 1) * (delta + jnp.log1p(-0.5 * (1.0 - ue) * one_minus_z2))
    return new, dK


def integrate(value_and_grad, z, u, potential, grad, eps, d, integrator="mclachlan"):
    """One step of the splitting ``integrator`` from ``(z, u)`` (``potential``, ``grad`` at
    ``z``): ``(z, u, potential, grad, energy_error)``."""
    bs, as_ = INTEGRATORS[integrator]
    dK = jnp.zeros((), potential.dtype)
    u, k = velocity_update(u, grad, bs[0] * eps, d)
    dK = dK + k
    U = potential
    for a, b in zip(as_, bs[1:], strict=True):
        z = z + (a * eps) * u
        U, grad = value_and_grad(z)
        u, k = velocity_update(u, grad, b * eps, d)
        dK = dK + k
    return z, u, U, grad, (U - potential) + dK


def refresh(u, key, eps, L, d):
    """Partial refresh: ``u`` decays by ``c = exp(-eps / L)`` towards an isotropic draw on the
    sphere (Gaussian noise of variance ``(1 - c^2) / d`` per entry), renormalised."""
    c = jnp.exp(-eps / L)
    nu = jax.random.normal(key, u.shape, u.dtype)
    new = c * u + jnp.sqrt(1.0 - c * c) * nu / jnp.sqrt(jnp.asarray(d, u.dtype))
    return new / jnp.sqrt(_dot(new, new))


def variance_length(take, last, z, n, mean_z, m2_z, L):
    """The warm-up's estimate of L: a Welford update of ``z``'s moments where ``take``, and at
    ``last`` (with two draws or more) ``L = sqrt(sum of the variances)``; returns
    ``(n, mean_z, m2_z, L)``."""
    take = take.astype(jnp.int32)
    n = n + take
    dz = z - mean_z
    mean_z = mean_z + take * dz / jnp.maximum(n, 1).astype(z.dtype)
    m2_z = m2_z + take * dz * (z - mean_z)
    var_sum = jnp.sum(m2_z) / jnp.maximum(n - 1, 1).astype(z.dtype)
    return n, mean_z, m2_z, jnp.where(last & (n >= 2) & (var_sum > 0), jnp.sqrt(var_sum), L)


def projections(z, theta):
    """The scalars whose autocorrelation sets ``L``: the parameters' latents ``theta`` and
    :data:`N_SIGNS` sums of all of ``z``'s coordinates with fixed pseudo-random signs (a hash of
    the index: nothing stored, each a local sum and one all-reduce), over ``sqrt(size)`` so that
    each is a unit-variance direction where ``z`` is white."""
    idx = jax.lax.iota(jnp.uint32, z.shape[-1])
    out = [theta.astype(z.dtype)]
    for j in range(N_SIGNS):
        h = idx * jnp.uint32(0x9E3779B1) + jnp.uint32(0x85EBCA77 * (j + 1) & 0xFFFFFFFF)
        h = h ^ (h >> jnp.uint32(15))
        sign = 1.0 - 2.0 * ((h >> jnp.uint32(7)) & jnp.uint32(1)).astype(z.dtype)
        out.append((_dot(z, sign) / jnp.sqrt(jnp.asarray(z.shape[-1], z.dtype)))[None])
    return jnp.concatenate(out)


def autocorrelation_window(num_warmup: int, tune_L: str) -> int:
    """Transitions at the warm-up's end whose projections set ``L``; 0 where ``L`` stays the
    variance's (``tune_L="variance"``, or a warm-up too short for :data:`MIN_WINDOW`)."""
    if tune_L not in MCLMC_LENGTHS:
        raise ValueError(f"inference.mclmc_length must be one of {MCLMC_LENGTHS}, got {tune_L!r}")
    w = int(num_warmup * WINDOW)
    return w if tune_L == "autocorrelation" and w >= MIN_WINDOW else 0


def mclmc_kernel(post, latent: LatentLayout, num_warmup: int = 100, step_size: float = 0.1,
                 integrator: str = "mclachlan", tune_L: str = "variance", energy_error: float = TARGET) -> Kernel:
    """Unadjusted MCLMC on ``latent`` (the sharded flat latent), tuned during ``num_warmup``
    transitions from the first step size ``step_size``. One transition is one integrator step
    (1 gradient for the leapfrog, 2 for McLachlan's) and a partial refresh. ``tune_L``: how the
    warm-up ends by setting ``L`` (the module's docstring). ``energy_error``: the energy error's
    variance per dimension the step size is tuned to (``inference.mclmc_energy_error``; the
    kernel's bias grows with it)."""
    if latent.pytree:
        raise ValueError("inference.kernel=mclmc runs on the flat latent: set inference.sampler=sharded")
    if integrator not in INTEGRATORS:
        raise ValueError(f"inference.integrator must be one of {tuple(INTEGRATORS)}, got {integrator!r}")
    num_warmup, d, target = int(num_warmup), int(latent.dim), float(energy_error)
    n_grads = len(INTEGRATORS[integrator][1])
    half, quarter3 = num_warmup // 2, (3 * num_warmup) // 4
    window = autocorrelation_window(num_warmup, tune_L)
    var_end = num_warmup - window  # the Welford pass covers [half, var_end), its L is set at var_end - 1
    n_proj = post.layout.n_params + N_SIGNS

    def value_and_grad(data):
        return jax.value_and_grad(latent.potential_gen(data))

    def init_one(z0, key, data):
        U, g = value_and_grad(data)(z0)
        key, k_u = jax.random.split(key)
        u = jax.random.normal(k_u, z0.shape, z0.dtype)
        u = u / jnp.sqrt(_dot(u, u))
        f = lambda x: jnp.asarray(x, z0.dtype)
        return MclmcState(z0, u, U, g, key, jnp.zeros((), jnp.int32), f(step_size), f(jnp.sqrt(d)), f(0.0), f(0.0),
                          jnp.zeros((), jnp.int32), jnp.zeros_like(z0), jnp.zeros_like(z0),
                          jnp.zeros((max(window, 1), n_proj), z0.dtype))

    init, template = chains_of(init_one, latent)

    def step(state, data):
        key, k_ref = jax.random.split(state.rng_key)
        eps = state.step_size
        z, u, U, g, dE = integrate(value_and_grad(data), state.z, state.u, state.potential, state.grad, eps, d,
                                   integrator)
        xi = dE * dE / (d * target)
        bad = ~(jnp.isfinite(dE) & jnp.isfinite(U) & (xi < DIVERGED))
        keep = lambda new, old: jnp.where(bad, old, new)
        z, u, U, g = keep(z, state.z), keep(u, state.u), keep(U, state.potential), keep(g, state.grad)
        warm = state.i < num_warmup
        # the step size: the weighted average of xi / eps^6 (a divergence shrinks it instead)
        w = jnp.exp(-0.5 * (jnp.log(jnp.maximum(xi, 1e-30)) / 9.0) ** 2)
        # the average restarts at the half and at three quarters, and keeps every step in between
        decay = jnp.where((state.i == half) | (state.i == quarter3), 0.0, jnp.where(state.i > half, 1.0, DECAY))
        xi_avg = decay * state.xi_avg + w * xi / eps**6
        w_avg = decay * state.w_avg + w
        tuned = jnp.where(bad, SHRINK * eps, (xi_avg / jnp.maximum(w_avg, 1e-30)) ** (-1.0 / 6.0))
        tuned = jnp.maximum(jnp.where(jnp.isfinite(tuned), tuned, SHRINK * eps), MIN_STEP)
        # after the warm-up a divergence shrinks the step for the rest of the chain: a chain that
        # reaches a stiffer region than its warm-up saw would otherwise diverge there at every step
        new_eps = jnp.where(warm, tuned, jnp.where(bad, jnp.maximum(SHRINK * eps, MIN_STEP), eps))
        xi_avg, w_avg = jnp.where(warm & ~bad, xi_avg, state.xi_avg), jnp.where(warm & ~bad, w_avg, state.w_avg)
        # L: Welford over the warm-up's second half (up to the window), read at its last transition
        n, mean_z, m2_z, L = variance_length(warm & (state.i >= half) & (state.i < var_end) & ~bad,
                                             warm & (state.i == var_end - 1), z, state.n_z, state.mean_z,
                                             state.m2_z, state.L)
        trace = state.trace
        if window:  # ... then from the autocorrelation of the projections over the window
            row = jnp.clip(state.i - var_end, 0, window - 1)
            record = warm & (state.i >= var_end)
            theta, _ = latent.latents(SimpleNamespace(z=z), data)
            trace = jnp.where(record, trace.at[row].set(projections(z, theta)), trace)
            tau = autocorrelation_time(trace)
            L = jnp.where(warm & (state.i == num_warmup - 1), LFACTOR * new_eps * jnp.mean(tau), L)
        u = refresh(u, k_ref, eps, state.L, d)
        new = MclmcState(z, u, U, g, key, state.i + 1, new_eps, L, xi_avg, w_avg, n, mean_z, m2_z, trace)
        new = jax.lax.with_sharding_constraint(new, latent.shardings(new))
        one = jnp.ones((), U.dtype)
        info = StepInfo(potential_energy=U, energy=jnp.full((), jnp.nan, U.dtype), diverging=bad,
                        num_steps=jnp.asarray(n_grads, jnp.int32), tree_depth=jnp.zeros((), jnp.int32),
                        accept_prob=jnp.where(bad, 0.0, one), mean_accept_prob=one, step_size=eps,
                        energy_error=jnp.where(bad, jnp.nan, dE / jnp.sqrt(jnp.asarray(d, dE.dtype))),
                        turning=jnp.full((), jnp.nan, U.dtype))
        return new, info

    return Kernel(name="mclmc", latent=latent, init=init, step=step, latents=latent.latents,
                  iteration=lambda state: state.i, template=template, shardings=latent.shardings)
