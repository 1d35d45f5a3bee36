"""Compile time against XLA flags: the SMALL test posterior's value and gradient on a (2, 2)
mesh, lowered and compiled cold (no persistent cache) in a fresh process per flag set, then
run 10 times. Side by side in one run; the table goes to docs/benchmarks.md.

usage: python -m scripts.bench.compile_flags ["--flag=value" ...]   (default: none vs -O0)
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLAG_SETS = ["", "--xla_backend_optimization_level=0"]


def measure() -> dict:
    import jax

    from tests.helpers.posterior import small_posterior

    post, data, lat = small_posterior((2, 2))
    flat = post.layout.pack(lat.theta, lat.s)
    f = jax.jit(jax.value_and_grad(lambda z, d: post.potential_flat(z, d)))
    t0 = time.perf_counter()
    lowered = f.lower(flat, data)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    jax.block_until_ready(compiled(flat, data))
    t3 = time.perf_counter()
    for _ in range(10):
        out = compiled(flat, data)
    jax.block_until_ready(out)
    return {"lower_s": t1 - t0, "compile_s": t2 - t1, "run10_s": time.perf_counter() - t3, "value": float(out[0])}


def main(flag_sets) -> None:
    print("| flags | lower | XLA compile | 10 runs | U |\n| --- | --- | --- | --- | --- |")
    for flags in flag_sets:
        env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
                   XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count=4".strip())
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        out = subprocess.run([sys.executable, "-m", __spec__.name, "--child"], env=env, capture_output=True, text=True,
                             cwd=ROOT, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {flags or 'default'} | {r['lower_s']:.1f} s | {r['compile_s']:.1f} s | {r['run10_s']:.2f} s "
              f"| {r['value']:.6f} |")


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        print(json.dumps(measure()))
    else:
        main(sys.argv[1:] or FLAG_SETS)
