#!/usr/bin/env python
"""Benchmark the forward model: forward time, value-and-gradient time, peak memory, FFT floor.

Each configuration runs in a fresh worker process (so that its peak RSS is its own) with as
many CPU devices as its ``pdims`` needs. Timings are medians over ``--repeats`` runs after one
warm-up (compilation) run. One table row per configuration is printed; ``--json`` writes a list
of one JSON object per configuration.

    python -m scripts.bench.forward --mesh 128 --steps 10 --pdims 1x2 --adjoint reversible --json OUT

``--mesh``, ``--steps``, ``--pdims`` and ``--adjoint`` take comma-separated lists; every
combination is run. The FFT floor is one forward and three inverse FFTs of the same mesh on the
same devices (the FFT work of one PM step); ``step/floor`` is the PM step time over it.

The full posterior's value and gradient against this PM gradient: scripts/bench/posterior.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time


def _parse_mesh(s: str) -> tuple[int, int, int]:
    parts = [int(p) for p in s.lower().split("x")]
    if len(parts) == 1:
        parts *= 3
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"mesh must be N or NXxNYxNZ, got {s!r}")
    return tuple(parts)  # type: ignore[return-value]


def worker(cfg: dict) -> dict:
    """Run one configuration in this process (devices already set by the parent)."""
    import resource  # noqa: PLC0415

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    if cfg["dtype"] == "float64":
        jax.config.update("jax_enable_x64", True)
    from fli.cosmo.background import planck18  # noqa: PLC0415
    from fli.sim.grid import Grid  # noqa: PLC0415
    from fli.sim.host import release_freed_memory  # noqa: PLC0415
    from fli.sim.nbody import density, simulate  # noqa: PLC0415
    from fli.sim.sharding import make_mesh, white_noise  # noqa: PLC0415

    def rss_mb() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    mesh = make_mesh(cfg["pdims"])
    grid = Grid(tuple(cfg["mesh"]), tuple([cfg["box"]] * 3), mesh, halo=cfg["halo"],
                fft_backend=cfg["backend"], dtype=cfg["dtype"])
    dt = grid.jdtype
    cosmo = jax.tree.map(lambda v: jnp.asarray(v, dt), planck18())
    noise = white_noise(0, grid.shape, mesh, dtype=dt)
    a_steps = np.linspace(cfg["a_start"], 1.0, cfg["steps"] + 1)
    weights = white_noise(1, grid.shape, mesh, dtype=dt)

    def forward(cosmo, noise):
        st, _, maxd = simulate(cosmo, noise, grid, a_steps, adjoint=cfg["adjoint"])
        return density(st.disp, grid), maxd

    def loss(cosmo, noise, w):
        rho, _ = forward(cosmo, noise)
        return jnp.sum(rho * w)

    def timed(fn, *args):
        fn = fn.lower(*args).compile()  # compile apart from the runs
        if cfg["trim"]:
            release_freed_memory()  # what the compiler freed goes back to the OS (fli.sim.host)
        out = fn(*args)
        jax.block_until_ready(out)  # warm-up run
        ts = []
        for _ in range(cfg["repeats"]):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            ts.append(time.perf_counter() - t0)
        m = fn.memory_analysis()  # XLA's buffers for one run, per device
        xla_mb = (m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes) / 2**20 if m else None
        return float(np.median(ts)), out, xla_mb

    base = rss_mb()
    fwd = jax.jit(forward)
    forward_s, (_, maxd), _ = timed(fwd, cosmo, noise)
    fwd_rss = rss_mb()
    if float(np.max(np.asarray(maxd))) >= cfg["halo"]:
        raise RuntimeError(f"particles moved {float(np.max(np.asarray(maxd))):.1f} cells, more than the halo "
                           f"({cfg['halo']}): the run is invalid, raise --halo")
    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    grad_s, (val, (gc, gs)), grad_xla_mb = timed(grad, cosmo, noise, weights)
    grad_rss = rss_mb()
    if not (np.isfinite(float(val)) and np.all(np.isfinite(np.asarray(gs)))):
        raise RuntimeError("non-finite value or gradient")

    plan = grid.fft
    x = noise

    def floor(x):
        k = plan.rfft(x)
        return [plan.irfft(k * (i + 1.0)) for i in range(3)]

    fft_floor_s, _, _ = timed(jax.jit(floor), x)
    step_s = forward_s / cfg["steps"]
    return {
        **{k: cfg[k] for k in ("mesh", "dtype", "backend", "halo", "trim")},
        "n_steps": cfg["steps"],
        "pdims": "x".join(map(str, cfg["pdims"])),
        "adjoint": cfg["adjoint"],
        "devices": jax.device_count(),
        "forward_s": forward_s,
        "grad_s": grad_s,
        "peak_rss_mb": grad_rss,
        "grad_xla_buffers_mb_per_device": grad_xla_mb,
        "forward_peak_rss_mb": fwd_rss,
        "baseline_rss_mb": base,
        "fft_floor_s": fft_floor_s,
        "step_over_floor": step_s / fft_floor_s,
        "max_disp_cells": float(np.max(np.asarray(maxd))),
        "platform": jax.devices()[0].platform,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mesh", default="128", help="N or NXxNYxNZ, comma-separated list")
    ap.add_argument("--steps", default="10", help="PM steps from a_start to 1, comma-separated")
    ap.add_argument("--pdims", default="1x2", help="PXxPY device mesh, comma-separated")
    ap.add_argument("--adjoint", default="reversible", help="checkpoint,reversible")
    ap.add_argument("--box", type=float, default=256.0, help="cube side [Mpc/h]")
    ap.add_argument("--halo", type=int, default=16, help="cells; must exceed the largest displacement")
    ap.add_argument("--a-start", type=float, default=0.1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--backend", default="pencil", choices=["pencil", "jaxdecomp"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-trim", action="store_true",
                    help="keep the heap the compiler freed (by default it is released after each compile)")
    ap.add_argument("--json", default=None, help="write the results to this file")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0

    configs = []
    for m, s, p, adj in itertools.product(args.mesh.split(","), args.steps.split(","),
                                          args.pdims.split(","), args.adjoint.split(",")):
        px, py = (int(v) for v in p.lower().split("x"))
        configs.append({"mesh": list(_parse_mesh(m)), "steps": int(s), "pdims": [px, py], "adjoint": adj,
                        "box": args.box, "halo": args.halo, "a_start": args.a_start, "dtype": args.dtype,
                        "backend": args.backend, "repeats": args.repeats, "trim": not args.no_trim})
    head = (f"{'mesh':>12} {'steps':>5} {'pdims':>5} {'adjoint':>10} {'forward_s':>9} {'grad_s':>8} "
            f"{'peak_MB':>8} {'floor_s':>8} {'step/floor':>10}")
    print(head, flush=True)
    results = []
    for cfg in configs:
        env = dict(os.environ)
        ndev = cfg["pdims"][0] * cfg["pdims"][1]
        if env.get("JAX_PLATFORMS", "cpu") == "cpu" and "CUDA_VISIBLE_DEVICES" not in env:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={ndev}").strip()
        proc = subprocess.run([sys.executable, "-m", __spec__.name, "--worker", json.dumps(cfg)], env=env,
                              capture_output=True, text=True)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            print(f"configuration {cfg} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
            return 1
        r = json.loads(line[len("RESULT "):])
        results.append(r)
        print(f"{'x'.join(map(str, r['mesh'])):>12} {r['n_steps']:>5} {r['pdims']:>5} {r['adjoint']:>10} "
              f"{r['forward_s']:9.3f} {r['grad_s']:8.3f} {r['peak_rss_mb']:8.0f} {r['fft_floor_s']:8.4f} "
              f"{r['step_over_floor']:10.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
