"""Energies of field-level samplers: float32 fields, float64 sums, a float32 result near 0.

A field-level chain's Hamiltonian is about D/2 (D the number of latents), and a float32 sum of D
terms cannot resolve the changes of order 1 that the accept test and NUTS's multinomial weights
read once D passes a few 10^5. The energies NumPyro sees must stay float32 (its kernels keep
position, momentum, step size and energies in one dtype), and compensated float32 sums do not
survive XLA:CPU's fusion (docs/nuts.md, "Energies", holds the measurements; docs/map.md, "Notes
moved from the code's docstrings", the details).

So :func:`offset_sum` ``(x, offset)`` returns ``float32(sum(x) - offset)``, the sum and the
subtraction traced as float64 under a scoped ``jax.enable_x64`` (the rest of the program keeps
x64 off): each device reduces its block in float64, one float64 scalar is all-reduced, the offset
is subtracted, and the result is rounded once. With ``offset`` near the expected sum the result is
of order sqrt(D) and resolves ~1e-4. The fields are never stored in float64 (the convert fuses
into the reduction), and the derivative is the plain sum of the tangents, so gradients are
unchanged. tests/infer/posterior/test_energy.py checks it against float64 (on sharded fields, and
one trajectory's energy change at 64^3) and that plain float32 sums fail the same check.
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
