"""Energies of field-level samplers: float32 fields, float64 sums, a float32 result near 0.

The Hamiltonian of a field-level chain is about D/2 (the prior's 0.5 |s|^2 and the kinetic
energy are each ~D/2, with fluctuations ~sqrt(D/2)). In float32 a plain sum of D = 2.6e5
squares (64^3) is off by ~1e-2 and its spacing at 1.3e5 is 0.008, so the change of order 1
that the accept test and NUTS's multinomial weights read is lost once D passes a few 10^5.

Two facts, measured on this stack, fix the design:

* NumPyro's kernels keep the position, momentum, step size and energies in one dtype. With
  ``jax_enable_x64`` on, a float64 energy or step size promotes the float32 position inside
  NUTS's tree and the branches of its ``cond`` disagree (TypeError). So the energies NumPyro
  sees stay float32.
* A compensated float32 sum (Knuth's TwoSum, pairwise) is exact on stored terms, but fused
  with the products that make the terms (``0.5 * v * v``) XLA:CPU duplicates the product
  into several fusions and contracts some into fused multiply-adds, which TwoSum cannot see:
  a 64^3 sum came out 1e-3 off instead of exact, and an optimisation barrier did not stop it.

So :func:`offset_sum` ``(x, offset)`` returns ``float32(sum(x) - offset)`` where the sum and the
subtraction are float64 operations traced under a scoped ``jax.enable_x64`` (the rest of the
program keeps x64 off): each device reduces its block in float64, one float64 scalar is
all-reduced, the offset is subtracted, and the result is rounded once. With ``offset`` ~ the
expected sum the float32 result is of order sqrt(D) and resolves ~1e-4. The fields are never
stored in float64 (the convert fuses into the reduction). Its derivative is the plain sum of
the tangents, so gradients are unchanged.

``tests/infer/test_energy.py`` checks it against float64 (the sum on sharded fields, and the energy
change of one trajectory at 64^3) and that plain float32 sums fail the same check.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _sum64(x, offset: float):
    with jax.enable_x64(True):
        return (jnp.sum(x.astype(jnp.float64)) - jnp.float64(offset)).astype(x.dtype)


def offset_sum(x, offset: float = 0.0):
    """``sum(x) - offset`` in ``x.dtype``, with the sum and subtraction in float64.

    ``x``: any (sharded) float32 array; ``offset`` a Python float. Differentiable: the tangent
    is the plain sum of the tangents.
    """

    @jax.custom_jvp
    def f(v):
        return _sum64(v, offset)

    @f.defjvp
    def _jvp(primals, tangents):
        (v,), (t,) = primals, tangents
        return f(v), jnp.sum(t).astype(v.dtype)

    return f(x)
