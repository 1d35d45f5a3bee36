#!/usr/bin/env python
"""How well each preconditioner whitens the posterior: the extreme eigenvalues of the
Gauss-Newton Hessian ``H = I + J^T J`` of the flat latent, and of ``C^{1/2} H C^{1/2}`` for the
low-rank (:mod:`fli.infer.sample.precondition`) and the Fourier-diagonal
(:mod:`fli.infer.sample.precondition_fourier`) ``C``, both built at the same point.

A sampler's step size is set by the largest eigenvalue and its trajectory by the smallest, so
the ratio of the two (the condition number) is what preconditioning should lower. Eigenvalues
by SciPy's Lanczos (``eigsh``) on the matrix-free products, so nothing here is the code under
test's own solver. The point is the mock's truth (a measurement, not a sampler start), and
the mock is made here from the model itself with no shape noise drawn.

    python -m scripts.studies.preconditioner_spectrum --json docs/bench/preconditioner_spectrum.json \\
        -- experiment=tiny survey.sigma_e=0.05 simulation.forward=linear
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def extremes(matvec, size: int, k: int = 3) -> tuple[list, list]:
    """The ``k`` largest and ``k`` smallest eigenvalues of a symmetric positive operator."""
    import numpy as np  # noqa: PLC0415
    from scipy.sparse.linalg import LinearOperator, eigsh  # noqa: PLC0415

    op = LinearOperator((size, size), matvec=matvec, dtype=np.float64)
    top = np.sort(eigsh(op, k=k, which="LA", tol=1e-4, return_eigenvectors=False))[::-1]
    shift = float(top[0])
    flipped = LinearOperator((size, size), matvec=lambda v: shift * v - matvec(v), dtype=np.float64)
    bottom = np.sort(shift - eigsh(flipped, k=k, which="LA", tol=1e-4, return_eigenvectors=False))
    return top.tolist(), bottom.tolist()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, default=128, help="low-rank: Lanczos steps")
    ap.add_argument("--probes", type=int, default=32, help="Fourier-diagonal: probes")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.store.files import write_json  # noqa: PLC0415
    from fli.infer.sample import precondition as lr  # noqa: PLC0415
    from fli.infer.sample import precondition_fourier as pf  # noqa: PLC0415
    from fli.infer.posterior.model import Latents, build_posterior, make_data  # noqa: PLC0415
    from fli.sim.sharding import make_mesh, white_noise  # noqa: PLC0415
    from fli.lensing.survey import noise_sigma  # noqa: PLC0415

    cfg, _ = compose(a.overrides)
    post = build_posterior(cfg, mesh=make_mesh((1, 1)))
    grid, lay = post.fwd.grid, post.layout
    s = white_noise(0, grid.shape, grid.mesh, dtype=grid.jdtype)
    theta = jnp.asarray(post.theta_of({"Omega_c": 0.2607, "sigma8": 0.8102}), grid.jdtype)
    kappa, _ = jax.jit(post.predict)(Latents(theta, s))
    sigma = noise_sigma(cfg.survey, cfg.lensing.fov_deg, cfg.lensing.npix)
    data = make_data(SimpleNamespace(kappa_obs=np.asarray(kappa), noise_sigma=sigma, mask=None), post.fwd)
    z = lay.pack(theta, s)
    op = lr.jtj_operator(post)
    route = "forward" if cfg.simulation.forward == "linear" else "reverse"
    jtj = jax.jit(lambda v: op(z[None], data, route)(v))
    as_f = lambda v: jnp.asarray(v, grid.jdtype)
    out = {"overrides": a.overrides, "size": int(lay.size), "point": "truth"}

    def report(name, matvec, built=None):
        t0 = time.perf_counter()
        top, bottom = extremes(matvec, lay.size)
        out[name] = {"top": top, "bottom": bottom, "condition": top[0] / bottom[0], **(built or {})}
        print(f"{name:>8}: largest {', '.join(f'{x:.4g}' for x in top)}; smallest "
              f"{', '.join(f'{x:.4g}' for x in bottom)}; condition {top[0] / bottom[0]:.4g} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)

    report("none", lambda v: np.asarray(as_f(v) + jtj(as_f(v)), np.float64))
    for name, build, half in (
            ("lowrank", lambda: lr.build_lowrank(post, data, z, a.rank, jax.random.PRNGKey(0)),
             lambda pre: jax.jit(lambda v: lr.sqrt_cov(pre, v))),
            ("fourier", lambda: pf.build_fourier(post, data, z, a.probes, jax.random.PRNGKey(0)),
             lambda pre: jax.jit(lambda v: pf.sqrt_cov(post, pre, v)))):
        pre, info = build()
        h = half(pre)

        def k(v, h=h):
            c = h(as_f(v))
            return np.asarray(h(c + jtj(c)), np.float64)

        report(name, k, {key: info[key] for key in ("grad_evals", "seconds") if key in info})
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(a.json, out)  # written aside and renamed: never half a record
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
