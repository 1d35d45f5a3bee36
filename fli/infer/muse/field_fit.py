r"""The field's MAP at fixed theta, MUSE's unit of work (:mod:`fli.infer.muse.estimator`): the solver and
its preconditioner.

**The solver** (:class:`FieldSolver`) runs fli-map's optimiser (L-BFGS by default) on
``s -> U(theta, s; x)`` until the gradient's RMS per cell is below ``gtol``, in one compiled
loop whose optimiser memory stays sharded like the field.

**The preconditioner** (:func:`field_preconditioner`, ``inference.map.muse.precondition_rank``).
In the white noise the field's Gauss-Newton Hessian is ``I + J_s^T J_s`` (``J_s`` the whitened
residual's Jacobian in the field), and plain L-BFGS spends most of its steps on the spread of
its eigenvalues. With the top ``r`` eigenpairs ``(lam_i, v_i)`` of ``J_s^T J_s``
(:func:`fli.infer.fit.lowrank.build_lowrank` on the field's entries alone) the fit moves ``y``,
``s = C^{1/2} y``, ``C = (I + V diag(lam) V^T)^{-1}``, in which those directions have unit
curvature. They are taken at ``(theta_start, s = 0)``, the linear response about the homogeneous
universe, which depends on neither the data nor a simulation: every fit of a run goes through
one procedure fixed before any of them, as MUSE asks. The stopping test stays on the field's own
gradient, ``C^{-1/2} grad_y``, so preconditioned and plain fits stop at the same criterion. The
gain (a third of the gradient evaluations a fit at rank 32, to the same MAP): docs/muse.md,
"Preconditioned fits"; docs/benchmarks.md, "MUSE's field fits preconditioned".
"""

from __future__ import annotations

import logging
import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fli.infer.posterior.layout import FLAT_SPEC
from fli.infer.fit.lowrank import LowRank, build_lowrank, inv_sqrt_cov, to_y, to_z
from fli.infer.posterior.model import Data, Latents, Posterior
from fli.sim.sharding import field_leaf_shardings, replicated_to_host

PRECONDITIONER_STREAM = 0x46495450  # "FITP": the Lanczos start's key, the same in every run


class FieldSolver:
    """``solve(theta, s0, data, max_steps=None, pre=None) -> (s_hat, steps, grad_norm, evals)``:
    the field's MAP at fixed theta with fli-map's optimiser (``inference.map.optimizer``, L-BFGS
    by default), from ``s0``, until the gradient's RMS per cell is below ``gtol`` or
    ``max_steps`` (None: the solver's own); ``pre``: a field preconditioner
    (:func:`field_preconditioner`) or None.

    One compiled program per posterior and preconditioner kind (theta, the data, the step budget
    and the preconditioner are arguments): the loop runs on the device, and the optimiser's
    memory stays sharded like the field (like the flat latent when preconditioned).
    ``grad_norm`` is the RMS of the field's gradient before the last step.
    """

    def __init__(self, post: Posterior, map_cfg, max_steps: int, gtol: float):
        import optax  # noqa: PLC0415

        from fli.infer.fit.optimize import make_optimizer  # noqa: PLC0415

        opt = make_optimizer(map_cfg)
        grid = post.fwd.grid
        lbfgs = map_cfg.optimizer == "lbfgs"
        rms = math.sqrt(grid.n_cells)
        self.max_steps = int(max_steps)

        def keep(state, pre):
            if pre is None:
                return jax.lax.with_sharding_constraint(state, field_leaf_shardings(state, grid.mesh, grid.shape))
            size = post.layout.size
            flat = lambda x: NamedSharding(grid.mesh, P(*([None] * (x.ndim - 1)), *FLAT_SPEC)
                                           if x.ndim and x.shape[-1] == size else P())
            return jax.lax.with_sharding_constraint(state, jax.tree.map(flat, state))

        def solve(theta, s0, data, max_steps, pre):
            if pre is None:  # the field itself
                x0, field, field_grad = s0, (lambda x: x), (lambda g: g)
            else:  # y, with s = the field part of ref + C^{1/2} y (the tails of y touch nothing)
                lay = post.layout
                x0 = to_y(pre, lay.pack(theta, s0))
                field = lambda y: lay.unpack(to_z(pre, y))[1]
                field_grad = lambda g: lay.unpack(inv_sqrt_cov(pre, g))[1]  # C^{-1/2} grad_y
            f = lambda x: post.potential(Latents(theta, field(x)), data)

            def body(carry):
                x, state, k, _, ev = carry
                if lbfgs:
                    value, grad = optax.value_and_grad_from_state(f)(x, state=state)
                    upd, state = opt.update(grad, state, x, value=value, grad=grad, value_fn=f)
                    n = jnp.asarray(optax.tree.get(state, "num_linesearch_steps"), jnp.int32)
                else:
                    grad = jax.grad(f)(x)
                    upd, state = opt.update(grad, state, x)
                    n = jnp.asarray(1, jnp.int32)
                gn = optax.tree.norm(field_grad(grad)) / rms
                return optax.apply_updates(x, upd), keep(state, pre), k + 1, gn, ev + n

            def cond(carry):
                return (carry[2] < max_steps) & (carry[3] > gtol)

            init = (x0, keep(opt.init(x0), pre), jnp.asarray(0, jnp.int32), jnp.asarray(jnp.inf, s0.dtype),
                    jnp.asarray(0, jnp.int32))
            x, _, k, gn, ev = jax.lax.while_loop(cond, body, init)
            return field(x), k, gn, ev

        self._solve = jax.jit(solve)

    def __call__(self, theta, s0, data: Data, max_steps: int | None = None, pre: LowRank | None = None):
        steps = self.max_steps if max_steps is None else int(max_steps)
        s, k, gn, ev = self._solve(theta, s0, data, jnp.asarray(steps, jnp.int32), pre)
        return s, int(replicated_to_host(k)), float(replicated_to_host(gn)), int(replicated_to_host(ev))


def field_preconditioner(post: Posterior, data: Data, theta, rank: int,
                         log: logging.Logger | None = None) -> tuple[LowRank, dict]:
    """The top ``rank`` eigenpairs of the field's ``J_s^T J_s`` at ``(theta, s = 0)`` as a
    :class:`~fli.infer.fit.lowrank.LowRank` on the flat latent (zero off the field's entries),
    and its summary (rank, gradient evaluations, seconds, eigenvalues). ``data`` gives the
    mask and the noise, not the values: the Jacobian does not read them."""
    lay = post.layout
    g = post.fwd.grid
    theta = jnp.asarray(theta, g.jdtype)
    zero = post.zeros().s
    ref = lay.pack(theta, zero)
    mask = lay.pack(jnp.zeros_like(theta), jnp.ones_like(zero))  # 1 on the field's entries, 0 on the tails
    key = jax.random.key(PRECONDITIONER_STREAM)
    return build_lowrank(post, data, ref, rank, key, log, mask=mask)
