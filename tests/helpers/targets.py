"""Targets whose posterior is known in closed form, for the kernels' tests."""

import jax.numpy as jnp


class Gaussian:
    """A target whose posterior is known: independent normals with scales 0.5 to 1.5 on the
    flat layout of a small field; quacks like the :class:`Posterior` a kernel reads."""

    def __init__(self, mesh, shape=(8, 8, 4), n_params=2):
        from fli.infer.posterior.layout import FlatLayout

        self.layout = FlatLayout(shape, mesh, n_params)
        self.dim = self.layout.size

    def scales(self, dtype=jnp.float32):
        return 1.0 + 0.5 * jnp.sin(jnp.arange(self.layout.size, dtype=dtype))

    def potential_flat(self, z, data, precise=False):
        return 0.5 * jnp.sum((z / self.scales(z.dtype)) ** 2)
