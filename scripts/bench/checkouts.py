#!/usr/bin/env python
"""The posterior's value and gradient in two checkouts side by side: a base commit and this tree.

For a change that should only make the model faster (a kernel's layout, a fusion), this times
``jax.value_and_grad`` of the posterior's potential at one point (theta at the prior's median,
s a standard-normal draw, data simulated there) with each checkout's own ``fli``, and checks that
both compute the same thing. BASE is checked out into a temporary git worktree. Each round runs
one fresh worker process per checkout and experiment, in an order that alternates from round to
round; a worker compiles, then times ``--repeats`` calls and reports their median. Reported per
experiment: each checkout's median over rounds, and the median over rounds of this tree's time
over the base's in the same round (on a shared machine only that ratio means anything), with the
largest relative difference of the value and of the gradient between the two checkouts.

    python -m scripts.bench.checkouts e70041f --rounds 3 \\
        --experiment "tiny_cic=experiment=tiny" \\
        --experiment "tiny_tsc=experiment=tiny simulation.assignment=tsc" \\
        --json docs/bench/stencil_layout.json

The workers run pinned to ``--cpu`` (XLA CPU's parallel loops use a second core even with its
one-thread flags) with the XLA flags in ``FLI_BENCH_XLA_FLAGS`` (default: XLA on one thread).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def worker(overrides: list[str], repeats: int, cpu: int) -> dict:
    """Time the posterior's value and gradient with the ``fli`` on this process's path."""
    os.sched_setaffinity(0, {cpu})  # before JAX starts its threads
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from scripts.bench.muse_cost import posterior_at_median  # noqa: PLC0415

    import fli  # noqa: PLC0415
    from fli.infer.posterior.model import Latents  # noqa: PLC0415

    _, post, theta, data = posterior_at_median(overrides)
    s = jax.random.normal(jax.random.key(1), post.zeros().s.shape, post.zeros().s.dtype)
    vg = jax.jit(jax.value_and_grad(lambda th, z: post.potential(Latents(th, z), data), argnums=(0, 1)))
    t0 = time.perf_counter()
    value, (g_theta, g_s) = jax.block_until_ready(vg(theta, s))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(vg(theta, s))
        times.append(time.perf_counter() - t0)
    return {"fli": str(Path(fli.__file__).parent), "devices": jax.device_count(), "seconds": float(np.median(times)),
            "compile_s": compile_s, "value": float(value), "grad_theta": np.asarray(g_theta, float).tolist(),
            "grad_s": np.asarray(g_s, float).ravel()[:: max(1, g_s.size // 4096)].tolist()}


def run_worker(tree: Path, overrides: list[str], repeats: int, cpu: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(tree), str(ROOT))), JAX_PLATFORMS="cpu",
               XLA_FLAGS=os.environ.get("FLI_BENCH_XLA_FLAGS", ONE_THREAD))
    p = subprocess.run([sys.executable, "-m", __spec__.name, "--worker", json.dumps(overrides), "--repeats", str(repeats),
                        "--cpu", str(cpu)], cwd=tree, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"the worker in {tree} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def rel_diff(a, b) -> float:
    import numpy as np  # noqa: PLC0415

    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", nargs="?", help="the base commit (checked out into a temporary worktree)")
    ap.add_argument("--experiment", action="append", default=[],
                    help="NAME=OVERRIDES (space-separated Hydra overrides); repeatable")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10, help="timed calls per worker")
    ap.add_argument("--cpu", type=int, default=0, help="the CPU the workers are pinned to")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", metavar="OVERRIDES_JSON", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker is not None:
        print(json.dumps(worker(json.loads(a.worker), a.repeats, a.cpu)))
        return 0
    if not a.base or not a.experiment:
        ap.error("give the base commit and at least one --experiment NAME=OVERRIDES")
    experiments = {}
    for e in a.experiment:
        name, sep, ov = e.partition("=")
        if not sep or not name:
            ap.error(f"--experiment takes NAME=OVERRIDES, got {e!r}")
        experiments[name] = ov.split()
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{a.base}^{{commit}}"], cwd=ROOT, capture_output=True,
                            text=True)
    if commit.returncode != 0:
        ap.error(f"base {a.base!r} is not a commit of {ROOT}")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "fli", "conf"], cwd=ROOT, capture_output=True,
                           text=True).stdout.split()
    out = {"base": commit.stdout.strip(), "tree": head.stdout.strip(), "tree_modified": dirty[1::2],
           "rounds": a.rounds, "repeats": a.repeats, "cpu": a.cpu,
           "xla_flags": os.environ.get("FLI_BENCH_XLA_FLAGS", ONE_THREAD), "experiments": {}}
    with tempfile.TemporaryDirectory(prefix="fli-ab-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), a.base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            for name, ov in experiments.items():
                rows = {"base": [], "tree": []}
                for r in range(a.rounds):
                    order = [("base", base), ("tree", ROOT)]
                    for side, tree in order if r % 2 == 0 else order[::-1]:
                        rows[side].append(run_worker(tree, ov, a.repeats, a.cpu))
                        print(f"{name} round {r + 1}/{a.rounds} {side}: {rows[side][-1]['seconds'] * 1e3:.1f} ms",
                              file=sys.stderr, flush=True)
                out["experiments"][name] = summarise(ov, rows)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    print("| experiment | base | this tree | this tree / base (median over rounds) "
          "| value, gradient: largest relative difference |")
    print("| --- | --- | --- | --- | --- |")
    for name, e in out["experiments"].items():
        print(f"| {name} | {e['base_s'] * 1e3:.1f} ms | {e['tree_s'] * 1e3:.1f} ms | {e['ratio']:.2f} "
              f"[{min(e['ratios']):.2f}, {max(e['ratios']):.2f}] | {e['value_rel_diff']:.1e}, "
              f"{max(e['grad_theta_rel_diff'], e['grad_s_rel_diff']):.1e} |")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


def summarise(overrides: list[str], rows: dict) -> dict:
    import numpy as np  # noqa: PLC0415

    b, t = rows["base"], rows["tree"]
    ratios = [tr["seconds"] / br["seconds"] for br, tr in zip(b, t, strict=True)]
    return {"overrides": overrides, "devices": t[0]["devices"],
            "base_s": float(np.median([r["seconds"] for r in b])),
            "tree_s": float(np.median([r["seconds"] for r in t])),
            "ratio": float(np.median(ratios)), "ratios": ratios,
            "compile_s": {"base": float(np.median([r["compile_s"] for r in b])),
                          "tree": float(np.median([r["compile_s"] for r in t]))},
            "value_rel_diff": rel_diff(t[0]["value"], b[0]["value"]),
            "grad_theta_rel_diff": rel_diff(t[0]["grad_theta"], b[0]["grad_theta"]),
            "grad_s_rel_diff": rel_diff(t[0]["grad_s"], b[0]["grad_s"])}


if __name__ == "__main__":
    raise SystemExit(main())
