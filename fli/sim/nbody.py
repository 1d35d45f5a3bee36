"""Particle-mesh gravity and the FastPM kick-drift-kick integrator, with two adjoints.

Time in units of 1/H0, lengths in Mpc/h, momentum :math:`p = a^3 E(a)\\, dx/da`:

.. math::

    \\frac{dx}{da} = \\frac{p}{a^3 E}, \\quad \\frac{dp}{da} = \\frac{F}{a^2 E}, \\quad
    F = -\\nabla\\psi, \\quad \\nabla^2 \\psi = \\tfrac32 \\Omega_m \\delta .

FastPM (Feng et al. 2016, arXiv:1603.00476) takes each step's integrals as ratios of growth
functions, so linear growth is exact at any step size:
:math:`\\Delta p = F(a_c) [G_f(a_1) - G_f(a_0)] / (a_c^2 E(a_c) g_f(a_c))` and
:math:`\\Delta x = p(a_c) [D_1(a_1) - D_1(a_0)] / G_f(a_c)`, with :math:`G_f = a^3 E\\, dD_1/da`,
:math:`g_f = dG_f/da`. A step (of a ``lax.scan``) is kick(a0 -> ah) drift(a0 -> a1) kick(ah -> a1),
ah the geometric midpoint; its end force is reused by the next step (one PM force per step).

Adjoints: ``"checkpoint"`` rematerialises each step (memory grows with the steps); ``"reversible"``,
a custom VJP, integrates the leapfrog backwards (memory independent of the steps), as pmwd does
(Li et al. 2022, arXiv:2211.09815). Hessian-vector products work through both, forward-over-reverse
and reverse-over-reverse (tests/sim/test_second_order.py); the latter stores the reversible backward
walk's residuals per step, so its memory grows with the steps too. Forward mode of the simulation
alone needs ``"checkpoint"``: JAX applies no forward mode to a custom VJP.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from fli.cosmo import background as cosmo_mod
from fli.cosmo.background import Cosmology
from fli.sim.fft import force_correction_kernel, gradient_kernel, inv_laplace_kernel
from fli.sim.grid import Grid
from fli.sim.lpt import linear_modes, lpt
from fli.sim.painting import Stencil, make_stencil, paint, read


class Density(NamedTuple):
    """The PM force's density at a step boundary, handed to the step's hook with what computing
    it made, so that a hook that filters the density and reads it back at the particles
    (:func:`fli.sim.pgd.pgd_shift`) does neither again: ``rho`` the particle count per cell (mean 1)
    ``[nx, ny, nz]``, ``rho_k`` its ``grid.fft.rfft``, ``stencil`` the stencil of the
    particles at the boundary (:func:`fli.sim.painting.make_stencil` of ``disp / grid.cell``, in the
    grid's mass assignment)."""

    rho: Array
    rho_k: Array
    stencil: Stencil


def density_of(disp: Array, grid: Grid) -> Density:
    """:class:`Density` of particles at ``disp`` [Mpc/h]: the PM force's (one stencil in the
    grid's mass assignment, one paint, one forward FFT)."""
    cells = disp / jnp.asarray(grid.cell, disp.dtype)
    st = make_stencil(cells, grid.mesh, grid.halo, grid.assignment)
    rho = paint(cells, grid.mesh, grid.halo, stencil=st, scheme=grid.assignment)
    return Density(rho, grid.fft.rfft(rho), st)


# hook(density: Density, disp, a, step) -> pytree of per-step observables (e.g. a lens plane)
Hook = Callable[[Density, Array, Array, Array], Any]


class PMState(NamedTuple):
    """Particles (one per cell) at one time: each ``[nx, ny, nz, 3]`` sharded ``P('x','y')``.

    disp: displacement from the Lagrangian cell centre [Mpc/h].
    mom: momentum ``p = a^3 E dx/da`` [Mpc/h H0].
    force: ``F = -grad psi`` at the particles for the current positions [Mpc/h H0^2].
    """

    disp: Array
    mom: Array
    force: Array


class StepCoeffs(NamedTuple):
    """Per-step FastPM factors, each ``[n_steps]``: first kick, drift, second kick, a1."""

    kick1: Array
    drift: Array
    kick2: Array
    a1: Array


def check_scale_factors(a_steps) -> np.ndarray:
    """Raise ``ValueError`` unless ``a_steps`` is a finite, strictly increasing list in (0, 1.2]."""
    a = np.asarray(a_steps, dtype=float)
    if a.ndim != 1 or a.size < 2:
        raise ValueError(f"scale factors must be a list of at least 2 values, got {a_steps!r}")
    if not np.all(np.isfinite(a)) or a[0] <= 0 or a[-1] > 1.2:
        raise ValueError(f"scale factors must be finite and in (0, 1.2], got {a.tolist()}")
    if np.any(np.diff(a) <= 0):
        i = int(np.argmax(np.diff(a) <= 0))
        raise ValueError(f"scale factors must increase: a[{i}] = {a[i]} >= a[{i + 1}] = {a[i + 1]}")
    return a


def step_coefficients(cosmo: Cosmology, a_steps: Array) -> StepCoeffs:
    """FastPM kick and drift factors for the steps ``a_steps[i] -> a_steps[i + 1]``."""
    a0, a1 = a_steps[:-1], a_steps[1:]
    ah = jnp.sqrt(a0 * a1)
    table = cosmo_mod.growth_table(cosmo)  # one ODE solve shared by every coefficient
    gf = partial(cosmo_mod.growth_Gf, cosmo, table=table)
    dgf = partial(cosmo_mod.growth_gf, cosmo, table=table)
    d1 = partial(cosmo_mod.growth_factor, cosmo, table=table)
    e = partial(cosmo_mod.E, cosmo)

    def kick(a_from, a_to, a_force):
        return (gf(a_to) - gf(a_from)) / (dgf(a_force) * a_force**2 * e(a_force))

    return StepCoeffs(
        kick1=kick(a0, ah, a0),
        drift=(d1(a1) - d1(a0)) / gf(ah),
        kick2=kick(ah, a1, a1),
        a1=a1,
    )


def pm_force(cosmo: Cosmology, disp: Array, grid: Grid) -> tuple[Array, Density]:
    """PM gravity at the particles, ``F = -grad psi`` with ``lap psi = 1.5 Omega_m delta``.

    Paint (one scatter; CIC or TSC, ``grid.assignment``), one forward FFT, three inverse FFTs,
    one read of the three components. The potential kernel carries the grid's resolution correction
    (``grid.force_coefficient``, see :func:`fli.sim.fft.force_correction_kernel`).
    Returns ``(force [nx,ny,nz,3] [Mpc/h H0^2], density)``, the :class:`Density` with its FFT
    and the particles' stencil, which the step's hook may reuse.
    """
    plan = grid.fft
    dens = density_of(disp, grid)  # its stencil is shared by the paint, the read and their adjoints
    kernel = inv_laplace_kernel(plan, grid.box, dtype=grid.dtype)
    if grid.force_coefficient:
        kernel = kernel * force_correction_kernel(plan, grid.box, grid.force_coefficient, dtype=grid.dtype)
    pot_k = dens.rho_k * (1.5 * cosmo.Omega_m * kernel)
    comps = jnp.stack([plan.irfft(-gradient_kernel(plan, grid.box, i, dtype=grid.dtype) * pot_k) for i in range(3)])
    force = read(comps, disp / jnp.asarray(grid.cell, disp.dtype), grid.mesh, grid.halo, stencil=dens.stencil,
                 scheme=grid.assignment)
    return force.astype(disp.dtype), dens


def _max_cells(disp: Array, grid: Grid) -> Array:
    """Largest |displacement| along x and y, in cells (the halo must cover it)."""
    cell = jnp.asarray(grid.cell[:2], disp.dtype)
    return jax.lax.stop_gradient(jnp.max(jnp.abs(disp[..., :2]) / cell))


def _boundary(cosmo: Cosmology, disp: Array, a1: Array, i: Array, grid: Grid, hook: Hook | None):
    """What happens at a step boundary: the PM force at ``disp`` and the step's observable."""
    force, dens = pm_force(cosmo, disp, grid)
    obs = hook(dens, disp, a1, i) if hook is not None else ()
    return force, obs


def _step(cosmo: Cosmology, state: PMState, c: StepCoeffs, grid: Grid, hook: Hook | None, i: Array):
    disp, mom, force = state
    mom = mom + force * c.kick1
    disp = disp + mom * c.drift
    force, obs = _boundary(cosmo, disp, c.a1, i, grid, hook)
    mom = mom + force * c.kick2
    return PMState(disp, mom, force), (obs, _max_cells(disp, grid))


def _unstep(cosmo: Cosmology, state: PMState, c: StepCoeffs, grid: Grid) -> PMState:
    """Exact inverse of :func:`_step` (in exact arithmetic): kick, drift, kick backwards.

    The reversible adjoint (:func:`_rev_bwd`) walks back with the same algebra.
    """
    disp, mom, force = state
    mom = mom - force * c.kick2
    disp = disp - mom * c.drift
    force, _ = pm_force(cosmo, disp, grid)
    mom = mom - force * c.kick1
    return PMState(disp, mom, force)


def _scan_steps(cosmo, state, coeffs, grid, hook, remat: bool):
    def body(s, xs):
        c, i = xs
        fn = jax.checkpoint(_step, static_argnums=(3, 4)) if remat else _step
        return fn(cosmo, s, c, grid, hook, i)

    idx = jnp.arange(coeffs.a1.shape[0])
    return jax.lax.scan(body, state, (coeffs, idx))


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _leapfrog_reversible(cosmo, state, coeffs, grid, hook):
    return _scan_steps(cosmo, state, coeffs, grid, hook, remat=False)


def _rev_fwd(cosmo, state, coeffs, grid, hook):
    final, obs = _scan_steps(cosmo, state, coeffs, grid, hook, remat=False)
    return (final, obs), (cosmo, final, coeffs)


def _dot(u: Array, v: Array) -> Array:
    return jnp.sum(u * v)


def _rev_bwd(grid, hook, res, cts):
    """Adjoint of the leapfrog, walking the steps backwards and rebuilding each state.

    Going back over step i (boundary i+1 -> i): undo the second kick with the force kept in the
    state, undo the drift, then evaluate the force at boundary i once, under ``jax.vjp``: its
    value undoes the first kick and its pullback takes the cotangent of that force, which is
    complete at this point (first kick of step i, second kick of step i-1, the observable of
    step i-1). One PM force and one force adjoint per step: the state is never stored.
    """
    cosmo, final, coeffs = res
    ct_final, (ct_obs, _) = cts
    n = coeffs.a1.shape[0]
    k1, dr, k2, a1 = coeffs

    def boundary_vjp(x, a, i):
        return jax.vjp(lambda c, x, a: _boundary(c, x, a, i, grid, hook), cosmo, x, a)

    # the last boundary: its force cotangent is the output's plus the last second kick's
    x, p, f = final
    xb, pb, fb = ct_final
    _, pull = boundary_vjp(x, a1[n - 1], n - 1)
    cb, dxb, ab_last = pull((fb + pb * k2[n - 1], jax.tree.map(lambda t: t[n - 1], ct_obs)))
    xb = xb + dxb

    def undo_kick2_drift(x1, p1, f1, xb1, pb1, k2_i, dr_i):
        ph = p1 - f1 * k2_i
        x0 = x1 - ph * dr_i
        return x0, ph, pb1 + xb1 * dr_i, _dot(pb1, f1), _dot(xb1, ph)

    def body(carry, xs):
        x1, p1, f1, xb1, pb1, cb = carry
        k1_i, dr_i, k2_i, k2_prev, a_prev, ob_prev, i_prev = xs
        x0, ph, phb, k2b, drb = undo_kick2_drift(x1, p1, f1, xb1, pb1, k2_i, dr_i)
        (f0, _), pull = boundary_vjp(x0, a_prev, i_prev)
        p0 = ph - f0 * k1_i
        cb_i, xb_i, ab = pull((phb * (k1_i + k2_prev), ob_prev))
        carry = (x0, p0, f0, xb1 + xb_i, phb, jax.tree.map(jnp.add, cb, cb_i))
        return carry, (_dot(phb, f0), drb, k2b, ab)

    xs = (k1[1:], dr[1:], k2[1:], k2[:-1], a1[:-1], jax.tree.map(lambda t: t[:-1], ct_obs),
          jnp.arange(n - 1))
    (x1, p1, f1, xb1, pb1, cb), (k1b, drb, k2b, ab) = jax.lax.scan(
        body, (x, p, f, xb, pb, cb), xs, reverse=True)
    # the first step: its starting force is an input (the initial state's), not evaluated here
    x0, ph, phb, k2b0, drb0 = undo_kick2_drift(x1, p1, f1, xb1, pb1, k2[0], dr[0])
    f0, _ = pm_force(cosmo, x0, grid)
    ct_state0 = PMState(xb1, phb, phb * k1[0])
    ct_coeffs = StepCoeffs(
        kick1=jnp.concatenate([_dot(phb, f0)[None], k1b]),
        drift=jnp.concatenate([drb0[None], drb]),
        kick2=jnp.concatenate([k2b0[None], k2b]),
        a1=jnp.concatenate([ab, ab_last[None]]),
    )
    return cb, ct_state0, ct_coeffs


_leapfrog_reversible.defvjp(_rev_fwd, _rev_bwd)


def nbody(
    cosmo: Cosmology,
    state: PMState,
    a_steps: Array,
    grid: Grid,
    *,
    hook: Hook | None = None,
    adjoint: str = "checkpoint",
) -> tuple[PMState, Any, Array]:
    """Integrate particles from ``a_steps[0]`` to ``a_steps[-1]`` with FastPM KDK steps.

    Args:
        state: particles at ``a_steps[0]`` with the force at their positions
            (see :func:`initial_state`).
        a_steps: ``[n_steps + 1]`` increasing scale factors; steps go between neighbours.
        hook: optional per-step observable ``hook(density, disp, a, step)`` evaluated after
            each step (density is the particle count per cell, mean 1; disp the particle
            displacements [Mpc/h]); outputs are stacked.
        adjoint: ``"checkpoint"`` or ``"reversible"`` (see module docstring).
    Returns:
        ``(final_state, observables, max_disp)`` where ``max_disp[n_steps]`` is the largest
        transverse displacement in cells after each step (check it against the halo).
    """
    coeffs = step_coefficients(cosmo, jnp.asarray(a_steps, grid.jdtype))
    if adjoint == "checkpoint":
        final, (obs, maxd) = _scan_steps(cosmo, state, coeffs, grid, hook, remat=True)
    elif adjoint == "reversible":
        final, (obs, maxd) = _leapfrog_reversible(cosmo, state, coeffs, grid, hook)
    else:
        raise ValueError(f"adjoint must be 'checkpoint' or 'reversible', got {adjoint!r}")
    return final, obs, maxd


def initial_state(cosmo: Cosmology, noise: Array, grid: Grid, a_start, lpt_order: int = 2) -> PMState:
    """2LPT (or Zel'dovich) particles at ``a_start`` from white noise, with their PM force."""
    delta_k = linear_modes(cosmo, noise, grid)
    disp, mom = lpt(cosmo, delta_k, grid, a_start, order=lpt_order)
    force, _ = pm_force(cosmo, disp, grid)
    return PMState(disp, mom, force)


def simulate(
    cosmo: Cosmology,
    noise: Array,
    grid: Grid,
    a_steps,
    *,
    lpt_order: int = 2,
    hook: Hook | None = None,
    adjoint: str = "checkpoint",
) -> tuple[PMState, Any, Array]:
    """White noise -> linear field -> LPT at ``a_steps[0]`` -> FastPM to ``a_steps[-1]``.

    Returns ``(final_state, observables, max_disp)`` as :func:`nbody`; the final density is
    ``density(final_state.disp, grid)``.
    """
    _check_inputs(cosmo, a_steps, noise, grid)
    a_steps = jnp.asarray(a_steps, grid.jdtype)
    state = initial_state(cosmo, noise, grid, a_steps[0], lpt_order)
    return nbody(cosmo, state, a_steps, grid, hook=hook, adjoint=adjoint)


def _is_concrete(x) -> bool:
    return not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(x))


def _check_inputs(cosmo: Cosmology, a_steps, noise: Array, grid: Grid) -> None:
    """Refuse bad input before anything is compiled (checks what is concrete at call time)."""
    if _is_concrete(a_steps):
        check_scale_factors(a_steps)
    if _is_concrete(cosmo):
        cosmo.validate()
    if tuple(noise.shape) != grid.shape:
        raise ValueError(f"white noise has shape {tuple(noise.shape)}, the grid {grid.shape}")


def density(disp: Array, grid: Grid) -> Array:
    """Particle count per cell (mean 1) ``[nx, ny, nz]`` ``P('x','y')`` from displacements [Mpc/h]."""
    return paint(disp / jnp.asarray(grid.cell, disp.dtype), grid.mesh, grid.halo, scheme=grid.assignment)
