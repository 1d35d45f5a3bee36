"""What checking fingerprints costs when a command reads its observation, against fli-nuts's
start-up on the same config.

Reads the observation of ``--mock`` with its fingerprints checked, and a copy with them
stripped (as written before fingerprints existed), ``--repeats`` times each, interleaved, in
one process; then runs ``fli-nuts`` on the mock until it logs that its chunk program is
compiled (the start-up a user waits through before the first draw) and stops it there.

    python -m scripts.bench.fingerprint --mock outputs/mock/default [--repeats 7] [--out docs/bench/fingerprint.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def strip(group: Path) -> None:
    import zarr

    from fli.store.fingerprint import CHUNKS_ATTR, GROUP_ATTR

    g = zarr.open_group(str(group), mode="r+")
    attrs = {k: v for k, v in dict(g.attrs).items() if k != GROUP_ATTR}
    g.attrs.clear()
    g.attrs.update(attrs)
    for name in g.array_keys():
        a = {k: v for k, v in dict(g[name].attrs).items() if k != CHUNKS_ATTR}
        g[name].attrs.clear()
        g[name].attrs.update(a)


def startup(mock: Path, overrides: list[str]) -> float:
    """Seconds from launching fli-nuts to its 'compiled the ... chunk program' line."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-m", "fli.cli.nuts", f"mock={mock}", f"run_dir={tmp}/run",
                              "inference.num_warmup=2", "inference.num_samples=2", "inference.chunk=2",
                              "inference.field_thin=2", *overrides], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        for line in p.stderr:
            if "chunk program in" in line:
                dt = time.perf_counter() - t0
                p.kill()
                p.wait()
                return dt
        p.wait()
        raise RuntimeError(f"fli-nuts ended (status {p.returncode}) before compiling its chunk program")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mock", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    from fli.store.io import find_group, load_observation

    group = find_group(a.mock, "mock")
    with tempfile.TemporaryDirectory() as tmp:
        bare = Path(tmp) / "bare" / group.name
        shutil.copytree(group, bare)
        strip(bare)
        load_observation(group), load_observation(bare.parent)  # warm the page cache and imports
        checked, unchecked = [], []
        for _ in range(a.repeats):
            t = time.perf_counter()
            obs = load_observation(group)
            checked.append(time.perf_counter() - t)
            t = time.perf_counter()
            load_observation(bare.parent)
            unchecked.append(time.perf_counter() - t)
    nbytes = sum(int(getattr(x, "nbytes", 0)) for x in (obs.kappa_obs, obs.kappa_true, obs.white_noise))
    s = startup(a.mock, a.overrides)
    c, u = statistics.median(checked), statistics.median(unchecked)
    out = {"mock": str(a.mock), "bytes_read": nbytes, "read_checked_s": c, "read_unchecked_s": u,
           "check_s": c - u, "fli_nuts_startup_s": s, "check_over_startup": (c - u) / s,
           "repeats": a.repeats, "reads_checked": checked, "reads_unchecked": unchecked}
    print(json.dumps({k: v for k, v in out.items() if not k.startswith("reads_")}, indent=1))
    if a.out:
        a.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
