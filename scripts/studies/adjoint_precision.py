#!/usr/bin/env python
"""Float32 reversible adjoint against float64 autodiff, and the float32 leapfrog reversal error.

    python -m scripts.studies.adjoint_precision --mesh 32 --box 256 --steps 5,10,20,40

For each number of steps: the relative error of the float32 gradient of
L = sum(density * w) with respect to the white noise (norm of the difference over the norm),
Omega_c and sigma8, for the reversible adjoint and for float32 checkpointed autodiff, both
against float64 checkpointed autodiff; and how far a float32 run integrated backwards lands
from its initial displacements (in cells). Prints one JSON line per step count.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mesh", type=int, default=32)
    ap.add_argument("--box", type=float, default=256.0)
    ap.add_argument("--steps", default="5,10,20,40")
    ap.add_argument("--pdims", default="1x2")
    args = ap.parse_args(argv)
    px, py = (int(v) for v in args.pdims.split("x"))
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={px * py}"
    import jax  # noqa: PLC0415

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from fli.cosmo.background import planck18  # noqa: PLC0415
    from fli.sim.grid import Grid  # noqa: PLC0415
    from fli.sim.nbody import _step, _unstep, density, initial_state, simulate, step_coefficients  # noqa: PLC0415
    from fli.sim.sharding import make_mesh, white_noise  # noqa: PLC0415

    mesh = make_mesh((px, py))
    grids = {dt: Grid((args.mesh,) * 3, (args.box,) * 3, mesh, halo=4, dtype=dt) for dt in ("float32", "float64")}

    def grads(dt, adjoint, n):
        g = grids[dt]
        a_steps = np.linspace(0.1, 1.0, n + 1)
        # draw in float32 for both precisions (a float64 draw is a different field)
        w = white_noise(11, g.shape, mesh, dtype=jnp.float32).astype(g.jdtype)
        s = white_noise(0, g.shape, mesh, dtype=jnp.float32).astype(g.jdtype)

        def loss(oc, s8, s):
            c = jax.tree.map(lambda v: jnp.asarray(v, g.jdtype), planck18().replace(Omega_c=oc, sigma8=s8))
            st, _, _ = simulate(c, s, g, a_steps, adjoint=adjoint)
            return jnp.sum(density(st.disp, g) * w)

        oc, s8 = jnp.asarray(0.2607, g.jdtype), jnp.asarray(0.8102, g.jdtype)
        out = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(oc, s8, s)
        return [np.asarray(o, np.float64) for o in out]

    def rel(a, b):
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    def reversal(n):
        g = grids["float32"]
        c = jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), planck18())
        coeffs = step_coefficients(c, jnp.asarray(np.linspace(0.1, 1.0, n + 1), jnp.float32))

        @jax.jit
        def there_and_back(s):
            st0 = initial_state(c, s, g, 0.1)

            def fwd(st, xs):
                cc, i = xs
                return _step(c, st, cc, g, None, i)[0], None

            def bwd(st, cc):
                return _unstep(c, st, cc, g), None

            st, _ = jax.lax.scan(fwd, st0, (coeffs, jnp.arange(n)))
            back, _ = jax.lax.scan(bwd, st, coeffs, reverse=True)
            return jnp.max(jnp.abs(back.disp - st0.disp) / jnp.asarray(g.cell, jnp.float32))

        return float(there_and_back(white_noise(0, g.shape, mesh, dtype=jnp.float32)))

    for n in (int(v) for v in args.steps.split(",")):
        ref = grads("float64", "checkpoint", n)
        rev = grads("float32", "reversible", n)
        ckp = grads("float32", "checkpoint", n)
        row = {"mesh": args.mesh, "n_steps": n,
               "reversible_f32_rel_err": {"noise": rel(rev[2], ref[2]), "Omega_c": rel(rev[0], ref[0]),
                                          "sigma8": rel(rev[1], ref[1])},
               "checkpoint_f32_rel_err": {"noise": rel(ckp[2], ref[2]), "Omega_c": rel(ckp[0], ref[0]),
                                          "sigma8": rel(ckp[1], ref[1])},
               "f32_reversal_max_err_cells": reversal(n)}
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
