#!/usr/bin/env python
"""The sharded sampler against NumPyro's own latent layout: memory, collectives, overhead.

``memory``: compiles (does not run) one NUTS transition of the posterior, as fli-nuts builds
it, for each sampler (``inference.sampler=sharded|numpyro``) on each device layout, and reads
XLA's memory analysis per device (arguments, outputs, temporaries) and the compiled HLO's
collectives with a field-sized operand. ``lowrank`` is the sharded sampler in the low-rank
preconditioned latent (``inference.precondition=lowrank``, fli/infer/sample/precondition.py) with
``--rank`` orthonormal vectors (random ones: their memory and collectives do not depend on their
values, and building real ones costs ``2 x rank`` Hessian-vector products). The posterior gradient alone is compiled beside it: its
collectives are the forward model's own, and its memory the floor. Each (sampler, layout) runs
in its own process on 8 virtual CPU devices (the mesh takes the first px * py).

    python -m scripts.bench.sampler memory --overrides experiment=cube \\
        --pdims 1x1,1x2,2x2,2x4 --depth 6 --json docs/bench/sampler_memory.json
    python -m scripts.bench.sampler memory --samplers sharded,lowrank --rank 256 ...

``overhead``: runs NUTS draws of the sharded kernel and times them against the posterior
gradient, side by side in interleaved rounds: the ratio is the seconds of the draws over
(their leapfrog steps x the seconds of one value-and-gradient). 1 means the sampler's own
work costs nothing beside the simulation.

    python -m scripts.bench.sampler overhead --mock /tmp/mock_tiny --overrides experiment=tiny \\
        --draws 4 --depth 4 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _collectives(hlo: str, field: int) -> dict:
    """Collectives with a field-sized operand (at least one block of 8 devices), by op."""
    from fli.sim.sharding import hlo_collectives  # noqa: PLC0415

    out: dict[str, int] = {}
    for (op, n), c in hlo_collectives(hlo).items():
        if n >= field // 8:
            out[op] = out.get(op, 0) + c
    return out


def _mem(compiled, field_bytes: float) -> dict:
    m = compiled.memory_analysis()
    d = {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes,
         "temporaries": m.temp_size_in_bytes}
    d["total"] = sum(d.values())
    d["total_over_field"] = d["total"] / field_bytes
    return d


def memory_one(overrides: list[str], pdims: tuple[int, int], sampler: str, depth: int, rank: int = 0) -> dict:
    """One (sampler, layout): compiled memory and field-sized collectives of one transition."""
    from types import SimpleNamespace  # noqa: PLC0415

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.infer.sample.kernels import make_kernel  # noqa: PLC0415
    from fli.infer.posterior.model import build_posterior, make_data  # noqa: PLC0415
    from fli.sim.sharding import make_mesh  # noqa: PLC0415

    cfg, _ = compose([*overrides, f"distributed.pdims=[{pdims[0]},{pdims[1]}]"])
    post = build_posterior(cfg, mesh=make_mesh(pdims))
    grid, lay = post.fwd.grid, post.layout
    n_bins, npix, _ = post.fwd.kappa_shape
    obs = SimpleNamespace(kappa_obs=np.zeros((n_bins, npix, npix), grid.dtype), noise_sigma=np.full(n_bins, 3e-3),
                          mask=None)
    data = make_data(obs, post.fwd)
    pre_bytes = 0
    if sampler == "lowrank":
        from fli.infer.sample.precondition import VECS_SPEC, LowRank, Preconditioned  # noqa: PLC0415

        kernel = make_kernel(post, "sharded", kernel="nuts", num_warmup=100, max_tree_depth=depth,
                             precondition="lowrank")
        # shapes only: the compiled step's memory and collectives do not depend on the values
        vecs = jax.ShapeDtypeStruct((rank, lay.size), grid.jdtype, sharding=jax.NamedSharding(grid.mesh, VECS_SPEC))
        pre = LowRank(jax.ShapeDtypeStruct((lay.size,), grid.jdtype, sharding=lay.sharding), vecs,
                      jax.ShapeDtypeStruct((rank,), grid.jdtype, sharding=jax.NamedSharding(grid.mesh, jax.P())))
        kdata = Preconditioned(data, pre)
        pre_bytes = (rank + 1) * lay.size * np.dtype(grid.dtype).itemsize
    else:
        kernel = make_kernel(post, sampler, kernel="nuts", num_warmup=100, max_tree_depth=depth)
        kdata = data
    z0 = jax.ShapeDtypeStruct((1, lay.size), grid.jdtype,
                              sharding=jax.NamedSharding(grid.mesh, jax.P(None, *lay.sharding.spec)))
    keys = jax.ShapeDtypeStruct((1, 2), jnp.uint32, sharding=jax.NamedSharding(grid.mesh, jax.P()))
    state = kernel.template(z0, keys, kdata)
    step = jax.jit(lambda s, d: jax.vmap(kernel.step, in_axes=(0, None))(s, d))
    field, fbytes = grid.n_cells, grid.n_cells * np.dtype(grid.dtype).itemsize
    t = time.perf_counter()
    comp = step.lower(state, kdata).compile()
    t_step = time.perf_counter() - t
    grad = jax.jit(jax.value_and_grad(lambda z, d: post.potential_flat(z, d, precise=True)))
    gcomp = grad.lower(jax.ShapeDtypeStruct((lay.size,), grid.jdtype, sharding=lay.sharding), data).compile()
    return {"sampler": sampler, "pdims": list(pdims), "devices": pdims[0] * pdims[1], "shape": list(grid.shape),
            "halo": cfg.simulation.halo, "max_tree_depth": depth, "field_bytes": fbytes,
            "rank": rank if sampler == "lowrank" else None, "preconditioner_bytes_all_devices": pre_bytes,
            "step": _mem(comp, fbytes), "gradient": _mem(gcomp, fbytes),
            "step_collectives_field_sized": _collectives(comp.as_text(), field),
            "gradient_collectives_field_sized": _collectives(gcomp.as_text(), field), "compile_s": t_step}


def memory(args) -> dict:
    rows = []
    for pd in args.pdims.split(","):
        for sampler in args.samplers.split(","):
            cmd = [sys.executable, "-m", __spec__.name, "_memory_one", "--pdims", pd, "--samplers", sampler,
                   "--depth", str(args.depth), "--rank", str(args.rank), "--overrides", *args.overrides]
            env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
            t = time.perf_counter()
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"{sampler} on {pd}: failed\n{r.stderr[-3000:]}")
            row = json.loads(r.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"{sampler:8s} {pd:5s} step total/field {row['step']['total_over_field']:7.2f} (args "
                  f"{row['step']['arguments'] / row['field_bytes']:.2f}, "
                  f"temps {row['step']['temporaries'] / row['field_bytes']:.2f})"
                  f"  gradient {row['gradient']['total_over_field']:7.2f}  field-sized collectives: step "
                  f"{row['step_collectives_field_sized']} gradient {row['gradient_collectives_field_sized']}"
                  f"  [{time.perf_counter() - t:.0f} s]", flush=True)
    for sampler in args.samplers.split(","):
        mine = [r for r in rows if r["sampler"] == sampler]
        one = next((r for r in mine if r["devices"] == 1), None)
        for r in mine:
            r["step_total_vs_one_device"] = r["step"]["total"] / one["step"]["total"] if one else None
    return {"overrides": args.overrides, "rows": rows}


def overhead(args) -> dict:
    import logging  # noqa: PLC0415

    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.infer.posterior.setup import prepare  # noqa: PLC0415
    from fli.infer.sample.run import kernel_of  # noqa: PLC0415
    from fli.infer.sample.start import chain_keys, initial_point  # noqa: PLC0415

    log = logging.getLogger("bench")
    cfg, _ = compose([*args.overrides, f"mock={args.mock}", f"inference.max_tree_depth={args.depth}",
                      "inference.num_warmup=0", "inference.step_size=0.05"])
    obs, post, data = prepare(cfg, log, compare_truth=False)
    kernel = kernel_of(cfg, post)
    k_inits, k_kernels = chain_keys(cfg.seed, 1)
    z, _ = initial_point(cfg, post, obs, k_inits[0], log)
    state = kernel.init(z[None], k_kernels, data)

    if args.no_vmap:  # one chain stepped as it is, not through jax.vmap over a chain axis of 1
        state = jax.tree.map(lambda x: x[0], state)

    def draws(state):
        def body(s, _):
            if args.no_vmap:
                s, info = kernel.step(s, data)
            else:
                s, info = jax.vmap(kernel.step, in_axes=(0, None))(s, data)
            return s, info.num_steps
        return jax.lax.scan(body, state, None, length=args.draws)

    run = jax.jit(draws).lower(state).compile()
    grad = jax.jit(jax.value_and_grad(lambda z, d: post.potential_flat(z, d, precise=True))).lower(z, data).compile()
    jax.block_until_ready(run(state))
    jax.block_until_ready(grad(z, data))
    ratios, t_draws, t_grads, steps_all = [], [], [], []
    def grads():
        t = time.perf_counter()
        for _ in range(args.grads):
            jax.block_until_ready(grad(z, data))
        return time.perf_counter() - t

    for _ in range(args.rounds):  # gradients timed on both sides of the draws: the load drifts
        tg = grads()
        t = time.perf_counter()
        state, steps = run(state)
        jax.block_until_ready(state)
        td = time.perf_counter() - t
        tg = (tg + grads()) / (2 * args.grads)
        n = int(np.asarray(steps).sum())
        ratios.append(td / (n * tg))
        t_draws.append(td / args.draws)
        t_grads.append(tg)
        steps_all.append(n)
        print(f"  round: {args.draws} draws {td:.2f} s, {n} leapfrog steps, gradient {tg * 1e3:.1f} ms -> ratio "
              f"{ratios[-1]:.3f}", flush=True)
    return {"overrides": args.overrides, "sampler": cfg.inference.sampler, "shape": list(post.fwd.grid.shape),
            "pdims": list(post.fwd.grid.pdims), "max_tree_depth": args.depth,
            "draws_per_round": args.draws, "vmap": not args.no_vmap,
            "leapfrog_steps": steps_all, "seconds_per_draw": t_draws, "seconds_per_gradient": t_grads,
            "ratio": ratios, "ratio_median": statistics.median(ratios)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["memory", "overhead", "_memory_one"])
    ap.add_argument("--overrides", nargs="*", default=[])
    ap.add_argument("--pdims", default="1x1,1x2,2x2,2x4")
    ap.add_argument("--samplers", default="sharded,numpyro")
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--rank", type=int, default=256, help="memory: the lowrank sampler's vectors")
    ap.add_argument("--mock")
    ap.add_argument("--draws", type=int, default=4)
    ap.add_argument("--grads", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-vmap", action="store_true", help="overhead: step one chain without jax.vmap")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.mode == "_memory_one":
        pd = tuple(int(x) for x in args.pdims.split("x"))
        print(json.dumps(memory_one(args.overrides, pd, args.samplers, args.depth, args.rank)))
        return
    out = memory(args) if args.mode == "memory" else overhead(args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    elif args.mode == "overhead":
        print(json.dumps({k: out[k] for k in ("ratio", "ratio_median", "seconds_per_draw")}))


if __name__ == "__main__":
    main()
