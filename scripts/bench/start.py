"""What a fli-nuts run spends before its first draw, in two checkouts side by side: the small
test mock's 12-draw chain (tests/helpers/posterior.py's SMALL and CHAIN) run by each checkout's
fli-nuts with JAX's compile log on. Each checkout runs twice with its own persistent compilation
cache, and the second run is the one reported: with XLA's compilation cached, what is left is
Python tracing the programs and lowering them, which no cache saves and every run pays.

usage: python -m scripts.bench.start BASE_COMMIT [--mock DIR]
       (BASE_COMMIT is checked out into a temporary git worktree; the other side is this tree)
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
from tests.helpers.posterior import CHAIN, SMALL  # noqa: E402
from tests.helpers.xla import FLAGS  # noqa: E402

LOG = re.compile(r"Finished (tracing (\S+) for jit|jaxpr to MLIR module conversion jit\((\S+)\)|"
                 r"XLA compilation of jit\((\S+)\)) in ([0-9.]+) sec")


def run(tree: Path, mock: Path, out: Path, cache: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), JAX_LOG_COMPILES="1", JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"{FLAGS} --xla_force_host_platform_device_count=8")
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "fli.cli.nuts", *SMALL, *CHAIN, f"mock={mock}", f"run_dir={out}",
                        f"compilation_cache={cache}"], env=env, cwd=tree, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"fli-nuts failed in {tree}:\n{p.stderr[-3000:]}")
    r = {"wall": wall, "tracing": 0.0, "lowering": 0.0, "compiling": 0.0, "chains_init": 0.0, "chunk": 0.0}
    for m in LOG.finditer(p.stderr):
        sec = float(m.group(5))
        if m.group(2):
            r["tracing"] += sec
            if m.group(2) in ("chains_init", "chunk"):
                r[m.group(2)] += sec
        elif m.group(3):
            r["lowering"] += sec
        else:
            r["compiling"] += sec
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("--mock", type=Path, help="a fli-mock run of SMALL (made here when not given)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fli-start-") as tmp:
        tmp = Path(tmp)
        mock = a.mock
        if mock is None:
            mock = tmp / "mock"
            subprocess.run([sys.executable, "-m", "fli.cli.mock", *SMALL, f"run_dir={mock}"], cwd=ROOT, check=True,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True)
        base = tmp / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), a.base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            rows = {}
            for name, tree in ((f"{a.base[:7]} (base)", base), ("this tree", ROOT)):
                cache = tmp / f"cache-{tree.name}"
                run(tree, mock, tmp / f"warm-{tree.name}", cache)  # fills the cache
                rows[name] = run(tree, mock, tmp / f"run-{tree.name}", cache)
                print(f"{name}: {rows[name]}", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    print("| checkout | fli-nuts wall | tracing (chains_init, chunk) | lowering | XLA (cached) |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in rows.items():
        print(f"| {name} | {r['wall']:.1f} s | {r['tracing']:.1f} s ({r['chains_init']:.1f} s, {r['chunk']:.1f} s) "
              f"| {r['lowering']:.1f} s | {r['compiling']:.1f} s |")


if __name__ == "__main__":
    main()
