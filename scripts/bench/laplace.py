#!/usr/bin/env python
"""Time the Laplace step's compile and run on the tests' real posterior, exact and Gauss-Newton.

    python -m scripts.bench.laplace --mesh 8,8,16 --dtype float64

The posterior is tests/helpers/posterior.py's SMALL one (PM forward, traced light cone, 2 bins
of 8x8 pixels) on one device, at the truth. For each Hessian it reports the seconds of the
first call of :func:`fli.infer.fit.laplace.laplace` (tracing, XLA compiling, running), XLA's own
compile time of the Schur program (from JAX's compile log), the CG iterations and the HVPs.
Compiling dominates on CPU, so the figure to compare between two versions of the code is the
XLA compile time; run both versions on a quiet machine, one after the other.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time



class _CompileLog(logging.Handler):
    """Collects 'Finished XLA compilation of jit(schur_columns) in X sec' from JAX's log."""

    def __init__(self):
        super().__init__()
        self.seconds: list[float] = []

    def emit(self, record):
        m = re.search(r"XLA compilation of jit\(schur_columns\) in ([0-9.]+) sec", record.getMessage())
        if m:
            self.seconds.append(float(m.group(1)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mesh", default="8,8,16", help="simulation.mesh as nx,ny,nz")
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    args = ap.parse_args(argv)

    import jax

    from fli.infer.fit.laplace import laplace
    from fli.infer.posterior.model import Latents
    from tests.helpers.posterior import small_posterior

    jax.config.update("jax_log_compiles", True)
    log = _CompileLog()
    logging.getLogger("jax").addHandler(log)
    logging.getLogger("jax").setLevel(logging.DEBUG)
    mesh = "[" + args.mesh + "]"
    with jax.enable_x64(args.dtype == "float64"):
        post, data, lat = small_posterior((1, 1), extra=[f"simulation.mesh={mesh}", "simulation.adjoint=reversible"],
                                          dtype=args.dtype)
        U = lambda th, s: post.potential(Latents(th, s), data)
        res = lambda th, s: post.residual(Latents(th, s), data)
        print(f"mesh {args.mesh}, {args.dtype}, jax {jax.__version__}")
        for kind in ("gauss_newton", "exact"):
            n_before = len(log.seconds)
            t0 = time.perf_counter()
            out = laplace(U, lat.theta, lat.s, residual=res, cg_tol=1e-10, cg_maxiter=2000, hessian=kind)
            total = time.perf_counter() - t0
            xla = sum(log.seconds[n_before:])
            print(f"{kind:>12}: first call {total:6.1f} s, XLA compile of the Schur program {xla:6.1f} s, "
                  f"CG iterations {list(map(int, out.cg_iterations))}, {out.n_hvp} HVPs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
