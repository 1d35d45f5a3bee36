"""MAP of the field-level posterior with Optax: Adam with a learning-rate schedule, or
L-BFGS with a zoom line search; optional annealing of the residual's smoothing scale.

The optimiser works on the pytree :class:`~fli.infer.posterior.model.Latents` (theta replicated, the
field sharded ``P('x','y')``): Optax's states are pytrees of the same layout, so its moments
and L-BFGS's memory stay sharded like the field. One jitted step serves every stage: the
smoothing width is an argument, not a constant, so nothing recompiles between stages.

Stages (``inference.map.anneal``): the widths ``anneal_arcmin`` each for ``anneal_steps``
steps, then the exact likelihood for the rest of the budget. The stage is a function of the
step number, so a resumed run takes up exactly where it stopped. L-BFGS's memory restarts at
each stage (its curvature pairs belong to the previous objective).

Stopping: the final stage stops when the relative change of the loss stays below ``tol`` for
``patience`` consecutive steps, or at the step budget.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fli.config import MapConfig
from fli.infer.posterior.model import Data, Latents, Posterior


def mend_optax_inner_products() -> bool:
    """Make Optax's inner products local on a sharded field; returns whether it had to.

    Optax's ``tree.vdot`` (L-BFGS's two-loop recursion, its line search) picks ``jnp.vdot``
    when ``jax.__version__ < '0.7.2'``, a comparison of strings that is true for jax 0.10.x.
    ``jnp.vdot`` ravels its operands, and raveling a field sharded ``P('x', 'y')`` gathers it:
    14 all-gathers of half the field in one compiled L-BFGS step on 8 devices
    (tests/infer/sample/test_base.py). Where that branch is taken on a jax that has the alternative,
    Optax's own ``tensordot`` form (no ravel) is put in its place; nothing else changes.

    Why a patch: Optax 0.2.8 takes no inner product from its caller (``optax.lbfgs`` and
    ``scale_by_zoom_linesearch`` call ``optax.tree.vdot`` themselves), so fli cannot pass
    one in. The patch is applied when fli builds an optimiser (:func:`make_optimizer`), not
    on import, and applying it again does nothing.
    """
    from packaging.version import Version  # noqa: PLC0415

    try:
        from optax.tree_utils import _tree_math  # noqa: PLC0415
    except ImportError:  # another optax layout: nothing to mend
        return False
    if getattr(_tree_math._vdot, "_fli_local", False):
        return True
    if not (jax.__version__ < "0.7.2" and Version(jax.__version__) >= Version("0.7.2")
            and hasattr(_tree_math, "_vdot")):
        return False

    def _vdot(a, b, precision=jax.lax.Precision.HIGHEST):
        if jnp.issubdtype(a.dtype, jnp.complexfloating):
            a = jnp.conj(a)
        return jnp.tensordot(a, b, a.ndim, precision=precision)

    _vdot._fli_local = True
    _tree_math._vdot = _vdot
    return True


class StepInfo(NamedTuple):
    """What one optimiser step reports (scalars)."""

    loss: jax.Array
    grad_norm: jax.Array
    evals: jax.Array  # value-and-gradient evaluations spent in this step


def make_optimizer(mcfg: MapConfig) -> optax.GradientTransformation:
    """The Optax transformation of ``inference.map`` (a minimiser of U), its inner products
    kept local on a sharded field (:func:`mend_optax_inner_products`)."""
    mend_optax_inner_products()
    if mcfg.optimizer == "lbfgs":
        return optax.lbfgs(memory_size=mcfg.lbfgs_memory,
                           linesearch=optax.scale_by_zoom_linesearch(max_linesearch_steps=20, verbose=False))
    n = mcfg.steps
    if mcfg.schedule == "constant":
        lr = mcfg.lr
    elif mcfg.schedule == "cosine":
        lr = optax.cosine_decay_schedule(mcfg.lr, n, alpha=mcfg.lr_final)
    else:
        lr = optax.exponential_decay(mcfg.lr, n, mcfg.lr_final)
    return optax.adam(lr)


def stage_widths(mcfg: MapConfig, pixel_arcmin: float) -> list[float]:
    """Smoothing width [pixels] of each stage; the last is 0 (the exact likelihood)."""
    if not mcfg.anneal:
        return [0.0]
    return [w / pixel_arcmin for w in mcfg.anneal_arcmin] + [0.0]


def stage_of(step: int, mcfg: MapConfig, n_stages: int) -> int:
    return min(step // mcfg.anneal_steps, n_stages - 1) if n_stages > 1 else 0


@dataclasses.dataclass
class MapRun:
    """The optimiser's state between steps (what a checkpoint holds).

    params: current :class:`Latents`; opt_state: Optax state; step: steps done;
    history: per-step ``[loss, grad_norm, evals, seconds, stage]`` rows; key: a PRNG key
    (unused by the deterministic optimisers, kept for restarts that draw).
    """

    params: Latents
    opt_state: Any
    step: int
    history: list
    key: jax.Array
    below_tol: int = 0


def init_state(opt: optax.GradientTransformation, params: Latents, post: Posterior):
    """``opt.init(params)`` placed like the field: Optax builds its moments and L-BFGS's memory
    with ``zeros_like``, which leaves a stacked memory ``[m, nx, ny, nz]`` whole on one device
    (measured) and, in a jitted init, every leaf; each field-shaped leaf is sharded here."""
    from fli.sim.sharding import field_leaf_shardings  # noqa: PLC0415

    grid = post.fwd.grid
    shardings = field_leaf_shardings(jax.eval_shape(opt.init, params), grid.mesh, grid.shape)
    return jax.jit(opt.init, out_shardings=shardings)(params)


def make_step(post: Posterior, mcfg: MapConfig, theta_fixed=None) -> tuple[Callable, optax.GradientTransformation]:
    """``step(params, opt_state, data, width) -> (params, opt_state, StepInfo)``, jitted once;
    the state it returns keeps the field's sharding (start it from :func:`init_state`).

    ``theta_fixed``: standardised parameters to hold fixed (the field-only MAP); their
    gradient is then zero and the optimiser never moves them.
    """
    from fli.sim.sharding import field_leaf_shardings  # noqa: PLC0415

    opt = make_optimizer(mcfg)
    grid = post.fwd.grid

    def keep(state):
        return jax.lax.with_sharding_constraint(state, field_leaf_shardings(state, grid.mesh, grid.shape))

    def objective(p: Latents, data: Data, width):
        th = p.theta if theta_fixed is None else jax.lax.stop_gradient(jnp.asarray(theta_fixed, p.theta.dtype))
        return post.potential(Latents(th, p.s), data, width)

    if mcfg.optimizer == "lbfgs":
        def step(p, state, data, width):
            fn = lambda q: objective(q, data, width)
            value, grad = optax.value_and_grad_from_state(fn)(p, state=state)
            updates, state = opt.update(grad, state, p, value=value, grad=grad, value_fn=fn)
            p = optax.apply_updates(p, updates)
            n_ls = optax.tree.get(state, "num_linesearch_steps")
            return p, keep(state), StepInfo(value, optax.tree.norm(grad), jnp.asarray(n_ls, jnp.int32))
    else:
        def step(p, state, data, width):
            value, grad = jax.value_and_grad(objective)(p, data, width)
            updates, state = opt.update(grad, state, p)
            p = optax.apply_updates(p, updates)
            return p, keep(state), StepInfo(value, optax.tree.norm(grad), jnp.asarray(1, jnp.int32))

    return jax.jit(step), opt


def run_map(post: Posterior, data: Data, mcfg: MapConfig, run: MapRun, step_fn, opt, *,
            pixel_arcmin: float, log=None, on_checkpoint: Callable[[MapRun], None] | None = None,
            report: Callable[[MapRun, StepInfo, float], None] | None = None) -> MapRun:
    """Take optimiser steps from ``run`` until the tolerance or the budget; returns the run.

    ``on_checkpoint(run)`` is called every ``checkpoint_every`` steps and at the end;
    ``report(run, info, seconds)`` after every step (progress on rank 0).
    """
    widths = stage_widths(mcfg, pixel_arcmin)
    n_st = len(widths)
    while run.step < mcfg.steps and not converged(run, mcfg):  # a resumed, converged run takes no step
        stage = stage_of(run.step, mcfg, n_st)
        if run.step > 0 and stage != stage_of(run.step - 1, mcfg, n_st) and mcfg.optimizer == "lbfgs":
            run.opt_state = init_state(opt, run.params, post)  # new objective: forget the old curvature pairs
        t0 = time.perf_counter()
        params, state, info = step_fn(run.params, run.opt_state, data, jnp.asarray(widths[stage], post.fwd.grid.jdtype))
        loss = float(info.loss)
        dt = time.perf_counter() - t0
        run.params, run.opt_state = params, state
        prev = run.history[-1][0] if run.history else math.nan
        run.history.append([loss, float(info.grad_norm), int(info.evals), dt, stage])
        run.step += 1
        if report is not None:
            report(run, info, dt)
        if not math.isfinite(loss):
            raise FloatingPointError(f"the loss is {loss} at step {run.step}: lower inference.map.lr "
                                     f"or check the data")
        rel = abs(prev - loss) / max(abs(loss), 1.0) if math.isfinite(prev) else math.inf
        final = stage == n_st - 1
        run.below_tol = run.below_tol + 1 if (final and rel < mcfg.tol) else 0
        done = run.below_tol >= mcfg.patience
        if on_checkpoint is not None and (run.step % mcfg.checkpoint_every == 0 or done or run.step >= mcfg.steps):
            on_checkpoint(run)
        if done:
            break
    return run


def converged(run: MapRun, mcfg: MapConfig) -> bool:
    return run.below_tol >= mcfg.patience


def history_array(run: MapRun) -> np.ndarray:
    """``[steps, 5]``: loss, gradient norm, evaluations, seconds, stage."""
    return np.asarray(run.history, dtype=np.float64).reshape(-1, 5)
