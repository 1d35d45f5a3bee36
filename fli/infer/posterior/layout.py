"""The latents as ONE flat vector sharded over every device (the layout samplers want).

NumPyro flattens all latent sites into one vector. Measured on this stack
(``shared/probes/nuts_latent_layouts.py``, DESIGN.md "NumPyro with sharded latents"): a flat
vector sharded ``P(('x', 'y'))`` whose every device slice maps onto that device's own field
block compiles to a NUTS step with no field-sized all-gather. So each device's slice is

    [ its field block, flattened (bx * by * nz) | a tail of ``n_tail`` entries ]

and the cosmological latents sit in the tail of device 0 (mesh position (0, 0)); every other
tail entry is a standard-normal dummy that enters the prior only. Device ``(i, j)`` of the
``(px, py)`` mesh holds slice ``i * py + j``. The order of the entries therefore depends on
``pdims``: anything saved in this layout records ``pdims`` and is converted with
:meth:`FlatLayout.unpack` / :meth:`FlatLayout.pack` when read on another layout.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fli.sim.sharding import AXES, FIELD_SPEC, mesh_pdims

FLAT_SPEC = P(AXES)


@dataclasses.dataclass(frozen=True)
class FlatLayout:
    """Static description of the flat latent vector of a field ``shape`` and ``n_params`` scalars.

    Attributes:
        shape: the field ``(nx, ny, nz)``; mesh: the ``('x', 'y')`` device mesh.
        n_params: cosmological latents (in device 0's tail); n_tail: tail length per device
            (``max(1, n_params)``).
    """

    shape: tuple[int, int, int]
    mesh: Mesh
    n_params: int

    @property
    def pdims(self) -> tuple[int, int]:
        return mesh_pdims(self.mesh)

    @property
    def n_devices(self) -> int:
        return math.prod(self.pdims)

    @property
    def n_tail(self) -> int:
        return max(1, self.n_params)

    @property
    def block(self) -> tuple[int, int, int]:
        px, py = self.pdims
        return (self.shape[0] // px, self.shape[1] // py, self.shape[2])

    @property
    def slice_size(self) -> int:
        return math.prod(self.block) + self.n_tail

    @property
    def size(self) -> int:
        """Length of the flat vector: ``n_devices * (block + n_tail)``."""
        return self.n_devices * self.slice_size

    @property
    def n_dummies(self) -> int:
        return self.size - math.prod(self.shape) - self.n_params

    @property
    def sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, FLAT_SPEC)

    def unpack(self, flat):
        """``flat [size]`` ``P(('x','y'))`` -> ``(theta [n_params] replicated, field [nx,ny,nz] P('x','y'))``.

        Each device reshapes its own slice; the scalars reach every device by one all-reduce
        of ``n_tail`` numbers.
        """
        nb, n = math.prod(self.block), self.n_params

        def local(v):
            field = v[:nb].reshape(self.block)
            first = (jax.lax.axis_index("x") == 0) & (jax.lax.axis_index("y") == 0)
            tail = jnp.where(first, v[nb:nb + n], jnp.zeros((n,), v.dtype))
            return jax.lax.psum(tail, AXES), field

        return jax.shard_map(local, mesh=self.mesh, in_specs=FLAT_SPEC, out_specs=(P(), FIELD_SPEC))(flat)

    def pack(self, theta, field, dummies=None):
        """Inverse of :meth:`unpack`; ``dummies`` is a flat vector whose tail entries fill the
        other tails (default zeros, the prior's mode)."""
        nb, n, nt = math.prod(self.block), self.n_params, self.n_tail
        theta = jnp.asarray(theta, field.dtype).reshape(n)
        if dummies is None:
            dummies = jnp.zeros((self.size,), field.dtype)

        def local(theta, f, d):
            first = (jax.lax.axis_index("x") == 0) & (jax.lax.axis_index("y") == 0)
            tail = d[nb:]
            mine = jnp.concatenate([theta, tail[n:]]) if n < nt else theta
            return jnp.concatenate([f.reshape(-1), jnp.where(first, mine, tail)])

        return jax.shard_map(local, mesh=self.mesh, in_specs=(P(), FIELD_SPEC, FLAT_SPEC), out_specs=FLAT_SPEC)(
            theta, field, jax.device_put(dummies, self.sharding) if not isinstance(dummies, jax.core.Tracer)
            else dummies)

    def dummy_mask(self):
        """``[size]`` float 1 on dummy entries, 0 elsewhere, sharded like the vector."""
        nb, n = math.prod(self.block), self.n_params

        def local():
            first = (jax.lax.axis_index("x") == 0) & (jax.lax.axis_index("y") == 0)
            idx = jnp.arange(self.n_tail)
            tail = jnp.where(first, (idx >= n).astype(jnp.float32), 1.0)
            return jnp.concatenate([jnp.zeros((nb,), jnp.float32), tail])

        return jax.jit(jax.shard_map(local, mesh=self.mesh, in_specs=(), out_specs=FLAT_SPEC,
                                     check_vma=False))()
