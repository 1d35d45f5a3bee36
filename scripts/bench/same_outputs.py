"""Compare two trees of outputs that scripts/bench/same_outputs.sh made before and after a change.

Arrays must be equal bit for bit: each zarr group's per-array SHA-256 (``fli_array_sha256``) and
its chunk files, the npz files' arrays, posterior.nc's variables. JSON, JSONL, CSV and YAML must
hold the same values once timings, the two trees' own paths, Hydra's time stamps and the
checkouts' paths are left out; a message that names a module file may name it at its new path
(``--renamed-since REV``: git's renames from REV to HEAD). Orbax's own files are left out: the
checkpoints' per-leaf checksums in ``meta/metadata`` decide. report.html is compared cell by
cell, and the cells that differ are listed (ESS per hour follows the wall time). Exit 0: the same.

    python -m scripts.bench.same_outputs OUT/before OUT/after --renamed-since 1e63871
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

TIMING = re.compile(r"(^|_)(time|times|seconds|secs|wall|elapsed|compile|timestamp|date|started|finished|per_draw|"
                    r"per_hour|hours|s_per|rate)(_|$)|_s$|^config_sha256$", re.I)  # the config hash holds paths
STAMP = re.compile(r"\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}(-\d{3})?")  # Hydra's run and sweep directories


def renames(rev: str) -> dict[str, str]:
    out = subprocess.run(["git", "diff", "--name-status", "--find-renames=30%", rev, "HEAD"], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2]).stdout
    return {p[1]: p[2] for line in out.splitlines() if (p := line.split("\t"))[0].startswith("R")}


class Compare:
    def __init__(self, a: Path, b: Path, moved: dict[str, str], checkouts: list[str]):
        self.a, self.b, self.moved, self.checkouts = a, b, moved, checkouts
        self.bad, self.notes, self.same, self.figures = [], [], 0, [0, 0]

    def norm(self, x):
        if isinstance(x, dict):
            out = {k: self.norm(v) for k, v in x.items() if not TIMING.search(str(k))}
            if any(TIMING.search(str(k)) for k in x) and "fli_array_sha256" in out:
                out.pop("fli_fingerprint", None)  # it hashes the group's attributes, a timing among them
            if isinstance(out.get("history"), list):  # fli-map's checkpointed history: [3] is seconds
                out["history"] = [r[:3] + r[4:] if isinstance(r, list) and len(r) > 3 else r for r in out["history"]]
            return out
        if isinstance(x, list):
            return [self.norm(v) for v in x]
        if isinstance(x, str):
            x = STAMP.sub("<STAMP>", x.replace(str(self.a), "<ROOT>").replace(str(self.b), "<ROOT>"))
            for old, new in self.moved.items():
                x = re.sub(r"(?<![\w/])" + re.escape(old), new, x)
            for c in self.checkouts:
                x = x.replace(c, "<CHECKOUT>")
        return x

    def equal(self, rel, same: bool, what: str = "differs"):
        if same:
            self.same += 1
        else:
            self.bad.append(f"{rel}: {what}")

    def file(self, pa: Path, pb: Path, rel: Path) -> None:
        s = pa.suffix
        if s == ".json" or pa.name in ("metadata", "COMPLETE"):
            self.equal(rel, self.norm(json.loads(pa.read_text())) == self.norm(json.loads(pb.read_text())))
        elif s == ".jsonl":
            rows = [[json.loads(r) for r in p.read_text().splitlines() if r.strip()] for p in (pa, pb)]
            self.equal(rel, self.norm(rows[0]) == self.norm(rows[1]))
        elif s == ".csv":
            ra, rb = ([r.split(",") for r in p.read_text().splitlines()] for p in (pa, pb))
            keep = [i for i, h in enumerate(ra[0]) if not TIMING.search(h)]
            self.equal(rel, [[r[i] for i in keep] for r in ra] == [[r[i] for i in keep] for r in rb])
        elif s == ".yaml":
            self.equal(rel, self.norm(pa.read_text()) == self.norm(pb.read_text()))
        elif s == ".npz":
            with np.load(pa) as za, np.load(pb) as zb:
                keys = [k for k in za.files if not TIMING.search(k)]
                diff = [k for k in keys if k not in zb.files or not np.array_equal(za[k], zb[k], equal_nan=True)]
                self.equal(rel, not diff and set(za.files) == set(zb.files), f"arrays differ: {diff}")
        elif s == ".nc":
            import xarray as xr  # noqa: PLC0415

            for grp in ("posterior", "sample_stats", "field_summaries", "observed_data"):
                try:
                    da, db = xr.open_dataset(pa, group=grp), xr.open_dataset(pb, group=grp)
                except (OSError, KeyError, ValueError):
                    continue
                for v in da.data_vars:
                    if not TIMING.search(v):
                        self.equal(f"{rel}:{grp}/{v}", v in db and np.array_equal(da[v].values, db[v].values,
                                                                                   equal_nan=True))
        elif s == ".html":
            ta, tb = (re.split(r"(?=<)", self.norm(p.read_text())) for p in (pa, pb))
            self.equal(rel, len(ta) == len(tb), "structure differs")
            self.notes += [f"{rel}: {x[:60]!r} != {y[:60]!r}" for x, y in zip(ta, tb) if x != y]
        elif s == ".png":
            self.figures[pa.read_bytes() != pb.read_bytes()] += 1
        else:  # zarr chunks and markers
            self.equal(rel, hashlib.sha256(pa.read_bytes()).digest() == hashlib.sha256(pb.read_bytes()).digest(),
                       "bytes differ")

    def run(self) -> int:
        for pa in sorted(self.a.rglob("*")):
            rel = pa.relative_to(self.a)
            if pa.is_dir() or pa.suffix == ".log" or "tmp" in pa.name:
                continue
            if "checkpoints" in rel.parts and ("state" in rel.parts or pa.name in ("commit_success.txt",
                                                                                   "_CHECKPOINT_METADATA")):
                continue  # orbax's storage: its own ids and time stamps
            pb = self.b / rel
            if not pb.exists():
                self.bad.append(f"{rel}: missing in {self.b}")
                continue
            self.file(pa, pb, rel)
        print(f"{self.same} files and arrays the same, {len(self.bad)} differ; figures: {self.figures[0]} "
              f"identical, {self.figures[1]} not")
        for line in self.bad + [f"note: {n}" for n in self.notes]:
            print(line)
        return 1 if self.bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--renamed-since", metavar="REV", help="git revision before the change: its file renames")
    p.add_argument("--checkout", action="append", default=[], metavar="DIR",
                   help="a checkout's path that outputs name (Hydra's config search path); repeatable")
    a = p.parse_args()
    moved = renames(a.renamed_since) if a.renamed_since else {}
    return Compare(a.before.resolve(), a.after.resolve(), moved, a.checkout).run()


if __name__ == "__main__":
    sys.exit(main())
