#!/usr/bin/env python
"""MUSE's wall time against how its fits are spread: one process, one process over two devices,
two processes of one device each (``inference.map.muse.spread=processes``), side by side.

    python -m scripts.bench.muse_spread --out /tmp/muse_spread --rounds 2 -- \\
        experiment=tiny simulation.forward=linear survey.sigma_e=0.05 inference.map.muse.n_sims=16

Makes one mock (``fli-mock`` with the overrides), then runs ``fli-map ... inference.map.estimator=muse``
in each setting, in rounds whose order rotates, each run in a fresh directory:

* ``1p1d``: one process, one CPU device, pinned to core 0 (the fits one after another on one core);
* ``1p2d``: one process, two devices (``distributed.pdims=[1,2]``), each fit sharded over both cores;
* ``2p1d``: two processes of one device each (scripts/launch/local.py), each pinned to its own core,
  sharing the simulations' fits.

Reports each run's wall time (start-up, compilation, the joint MAP and MUSE), the medians per
setting and their ratios to ``1p1d``, and the largest difference of the estimates between runs
(``2p1d`` fits the same programs from the same starts as ``1p1d``; ``1p2d`` sums in another
order). JSON with ``--json``. Run it with the cores otherwise idle: only the ratios mean anything on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ("1p1d", "1p2d", "2p1d")


def _cmd(setting: str, overrides: list[str], mock: Path, run: Path) -> list[str]:
    fli_map = [sys.executable, "-m", "fli.cli.map", *overrides, f"mock={mock}", f"run_dir={run}",
               "inference.map.estimator=muse", "progress=true"]
    if setting == "1p1d":
        return ["taskset", "-c", "0", *fli_map, "distributed.local_device_count=1"]
    if setting == "1p2d":
        return [*fli_map, "distributed.local_device_count=2", "distributed.pdims=[1,2]"]
    return [sys.executable, str(ROOT / "scripts" / "launch" / "local.py"), "-n", "2", "--devices-per-process", "1",
            "--", *fli_map, "distributed.pdims=[1,2]", "inference.map.muse.spread=processes"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("overrides", nargs="*", help="config overrides of fli-mock and fli-map (after --)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    mock = a.out / "mock"
    if not (mock / "mock.zarr" / "COMPLETE").exists():
        rc = subprocess.run([sys.executable, "-m", "fli.cli.mock", *a.overrides, f"run_dir={mock}", "progress=false"],
                            cwd=ROOT).returncode
        if rc:
            print(f"benchmark_muse_spread: fli-mock failed with status {rc}", file=sys.stderr)
            return rc
    runs = []
    for r in range(a.rounds):
        order = SETTINGS[r % 3:] + SETTINGS[:r % 3]
        for setting in order:
            run = a.out / f"{setting}_r{r}"
            if run.exists():
                subprocess.run(["rm", "-rf", str(run)], check=True)
            log = a.out / f"{setting}_r{r}.log"
            t0 = time.perf_counter()
            with open(log, "w") as f:
                rc = subprocess.run(_cmd(setting, a.overrides, mock, run), cwd=ROOT, stdout=f,
                                    stderr=subprocess.STDOUT).returncode
            wall = time.perf_counter() - t0
            if rc:
                print(f"benchmark_muse_spread: {setting} failed with status {rc}; see {log}", file=sys.stderr)
                return rc
            muse = json.loads((run / "map.json").read_text())["muse"]
            runs.append({"setting": setting, "round": r, "wall_s": wall, "theta_z": muse["theta_z"],
                         "iterations": muse["iterations"]})
            print(f"round {r} {setting}: {wall:.1f} s, {muse['iterations']} iterations, theta_z {muse['theta_z']}",
                  flush=True)
    med = {s: statistics.median(x["wall_s"] for x in runs if x["setting"] == s) for s in SETTINGS}
    ref = runs[0]["theta_z"]
    spread = max(abs(v - w) for x in runs for v, w in zip(x["theta_z"], ref, strict=True))
    report = {"overrides": a.overrides, "runs": runs, "median_wall_s": med,
              "over_1p1d": {s: med[s] / med["1p1d"] for s in SETTINGS}, "max_theta_z_difference": spread}
    print("| setting | median wall [s] | / 1p1d |\n| --- | --- | --- |")
    for s in SETTINGS:
        print(f"| {s} | {med[s]:.1f} | {med[s] / med['1p1d']:.2f} |")
    print(f"largest difference of theta_z between runs: {spread:.2g}")
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
