"""Run the catalogue of bad inputs and faults as a user would, and write docs/reliability.md.

Every case is a command line of fli-mock, fli-map, fli-nuts or fli-diagnose run in a fresh
process on the tiny experiment, against real runs it makes first (a mock, a 5-step MAP and a
short chain) or copies of them that it damages (a deleted or rewritten chunk, a truncated
checkpoint, a swapped mock, another command's directory, a full disk). For each it records the
exit status, the last line on stderr and what the command left behind in the directories it
was given (files added, removed or changed; ``.hydra/`` is Hydra's record of the call).

    python -m scripts.studies.reliability_catalogue --work /tmp/fli-catalogue [--out docs/reliability.md]

It takes about 15 minutes on 2 cores (most cases fail in seconds; the resumes compile).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ["experiment=tiny"]
CHAIN = ["inference.num_warmup=4", "inference.num_samples=4", "inference.chunk=4", "inference.field_thin=4",
         "inference.max_tree_depth=3"]


def run(cmd: str, args: list[str], env=None, timeout=900) -> tuple[int, str, float]:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", f"fli.cli.{cmd}", *args], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, **(env or {})}, timeout=timeout)
    err = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    last = err[-1] if err else ""
    if p.returncode not in (0, 2, 3, 4) and len(err) > 1:
        last = f"(traceback, {len(err)} lines) {last}"
    return p.returncode, last, time.perf_counter() - t


def snapshot(paths: list[Path]) -> dict[str, str]:
    out = {}
    for base in paths:
        if not base.exists():
            continue
        for p in [base, *base.rglob("*")] if base.is_dir() else [base]:
            if p.is_file():
                out[str(p)] = hashlib.sha1(p.read_bytes()).hexdigest()
            elif p.is_dir():
                out[str(p) + "/"] = "dir"
    return out


def left_behind(before: dict, after: dict, watch: list[Path]) -> str:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])

    def short(ps):
        names = sorted({_rel(p, watch) for p in ps})
        return ", ".join(names[:4]) + (f" (+{len(names) - 4})" if len(names) > 4 else "")

    parts = []
    if added:
        parts.append(f"added {short(added)}")
    if removed:
        parts.append(f"removed {short(removed)}")
    if changed:
        parts.append(f"changed {short(changed)}")
    return "; ".join(parts) or "nothing"


def _rel(p: str, watch: list[Path]) -> str:
    for w in watch:
        w_ = str(w)
        if p.startswith(w_):
            rest = p[len(w_):].lstrip("/")
            top = rest.split("/")[0] if rest else ""
            return f"{w.name}/{top}" if top else w.name
    return p


def copy(src: Path, dst: Path) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


def first_chunk(group: Path, array: str) -> Path:
    return next(p for p in sorted((group / array / "c").rglob("*")) if p.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/fli-catalogue"))
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "reliability.md")
    a = ap.parse_args()
    w = a.work.absolute()
    w.mkdir(parents=True, exist_ok=True)
    mock, mock2, mapr, chain = w / "mock", w / "mock_other", w / "map", w / "chain"
    # the real runs the cases start from (made once, kept across reruns)
    for path, done, cmd, args in ((mock, "mock.zarr/COMPLETE", "mock", [*TINY, f"run_dir={mock}"]),
                                  (mock2, "mock.zarr/COMPLETE", "mock", [*TINY, "seed=5", f"run_dir={mock2}"]),
                                  (mapr, "map.json", "map", [*TINY, f"mock={mock}", "inference.map.steps=5",
                                                             "inference.map.laplace=false", f"run_dir={mapr}"]),
                                  (chain, "nuts.json", "nuts", [*TINY, *CHAIN, f"mock={mock}", f"run_dir={chain}"])):
        if not (path / done).is_file():
            shutil.rmtree(path, ignore_errors=True)
            code, last, _ = run(cmd, args)
            if code:
                print(f"setting up {path} failed: {last}", file=sys.stderr)
                return 1
    cases = []

    def case(group, what, cmd, args, watch, prepare=None, env=None, expect=None):
        cases.append((group, what, cmd, args, watch, prepare, env, expect))

    new = w / "new"
    # ---- configuration
    for cmd, extra, what in [
        ("mock", ["experiment=tinyy"], "an experiment that does not exist"),
        ("mock", ["inference.num_sample=3"], "a mistyped key"),
        ("mock", ["simulation.zzz=1"], "a key that does not exist"),
        ("mock", ["cosmology=planck"], "a config-group option that does not exist"),
        ("mock", ["simulation.n_steps=0"], "simulation.n_steps = 0"),
        ("mock", ["simulation.dtype=float16"], "an unsupported dtype"),
        ("mock", ["lensing.npix=0"], "lensing.npix = 0"),
        ("mock", ["lensing.fov_deg=-1"], "a negative field of view"),
        ("mock", ["cosmology.Omega_c=-0.1"], "a negative Omega_c"),
        ("mock", ["distributed.pdims=[4,4]"], "more devices than there are"),
        ("mock", ["+seedd=1"], "a new key that is not in the schema"),
        ("mock", ["simulation.mesh=[15,16,64]", "distributed.pdims=[2,2]", "distributed.local_device_count=4"],
         "a mesh the device grid cannot split"),
        ("mock", ["seed=abc"], "a seed that is not an integer"),
        ("mock", ["--cfg=bogus"], "an unknown --cfg value"),
        ("mock", ["-x"], "an unknown option"),
        ("map", [], "fli-map without mock="),
        ("map", [f"mock={w / 'nowhere'}"], "a mock that does not exist"),
        ("map", [f"mock={mock}", "inference.map.optimizer=sgd"], "an unknown optimiser"),
        ("map", [f"mock={mock}", "inference.map.lr=-1"], "a negative learning rate"),
        ("map", [f"mock={mock}", "inference.map.estimator=muse", "inference.map.fix_cosmology=true"],
         "MUSE with the cosmology fixed"),
        ("map", [f"mock={mock}", "inference.map.muse.n_sims=2"], "MUSE with too few simulations"),
        ("nuts", [f"mock={mock}", "inference.num_warmup=-1"], "a negative warm-up"),
        ("nuts", [f"mock={mock}", "inference.target_accept=1.5"], "target_accept outside (0, 1)"),
        ("nuts", [f"mock={mock}", "inference.kernel=mala"], "an unknown kernel"),
        ("nuts", [f"mock={mock}", "inference.field_thin=3"], "field_thin that does not divide chunk"),
        ("nuts", [f"mock={mock}", "inference.chains_per_run=0"], "zero chains"),
        ("nuts", [f"mock={mock}", "init=nonsense"], "init that is no start"),
        ("nuts", [f"mock={mock}", f"init={w / 'point.json'}"], "a point file of unknown parameters"),
        ("nuts", [f"mock={mock2}", f"init={mapr}"], "init=<a MAP of another mock>"),
        ("nuts", [f"mock={mock}", f"init={chain}"], "init=<a fli-nuts run>"),
    ]:
        case("configuration", what, cmd, [*TINY, *extra, f"run_dir={new}"], [new])
    (w / "point.json").write_text(json.dumps({"Omega_x": 0.3}))
    # ---- fli-diagnose's input
    diag = w / "diag"
    case("fli-diagnose", "no chain given", "diagnose", [f"run_dir={diag}"], [diag])
    case("fli-diagnose", "a run that does not exist", "diagnose", [f"runs=[{w / 'nowhere'}]", f"run_dir={diag}"],
         [diag])
    case("fli-diagnose", "a mock given as a chain", "diagnose", [f"runs=[{mock}]", f"run_dir={diag}"], [diag])
    case("fli-diagnose", "a fli-map run given as a chain", "diagnose", [f"runs=[{mapr}]", f"run_dir={diag}"],
         [diag])
    case("fli-diagnose", "runs= and sweep= both", "diagnose", [f"runs=[{chain}]", f"sweep={w}", f"run_dir={diag}"],
         [diag])
    case("fli-diagnose", "a bad band", "diagnose", [f"runs=[{chain}]", "diagnose.rhat_pass=0.9",
                                                    f"run_dir={diag}"], [diag])
    case("fli-diagnose", "the same chain twice", "diagnose", [f"runs=[{chain},{chain}]", "diagnose.figures=false",
                                                              f"run_dir={diag}"], [diag])
    case("fli-diagnose", "run_dir of a fli-map run", "diagnose", [f"runs=[{chain}]", f"run_dir={mapr}"], [mapr])
    # ---- damaged or swapped data
    dm = w / "damaged_mock"

    def damage(fn):
        def prep():
            copy(mock, dm)
            fn(dm / "mock.zarr")
        return prep

    for what, fn in [
        ("a chunk of kappa_obs deleted", lambda g: first_chunk(g, "kappa_obs").unlink()),
        ("a chunk of noise_sigma deleted", lambda g: first_chunk(g, "noise_sigma").unlink()),
        ("a chunk of white_noise truncated", lambda g: (lambda f: f.write_bytes(f.read_bytes()[:10]))(
            first_chunk(g, "white_noise"))),
        ("kappa_obs's chunk replaced by another mock's", lambda g: shutil.copy(
            first_chunk(mock2 / "mock.zarr", "kappa_obs"), first_chunk(g, "kappa_obs"))),
        ("the COMPLETE marker removed", lambda g: (g / "COMPLETE").unlink()),
        ("an attribute edited (fov_deg)", lambda g: (lambda f: f.write_text(f.read_text().replace(
            '"fov_deg": 5.0', '"fov_deg": 6.0')))(g / "zarr.json")),
    ]:
        case("damaged data", f"mock: {what}; fli-nuts", "nuts", [*TINY, *CHAIN, f"mock={dm}", f"run_dir={new}"],
             [new, dm], prepare=damage(fn))
        case("damaged data", f"mock: {what}; fli-map", "map", [*TINY, f"mock={dm}", f"run_dir={new}",
                                                               "inference.map.steps=2"], [new, dm],
             prepare=damage(fn))
    ext = w / "extended"
    swapped = w / "swapped"

    def swap():
        copy(chain, ext)
        copy(mock2, swapped)

    case("swapped data", "extend a chain with another mock at a new path", "nuts",
         [*TINY, *CHAIN, "inference.num_samples=8", f"mock={mock2}", f"run_dir={ext}"], [ext],
         prepare=lambda: copy(chain, ext))
    case("swapped data", "extend a chain after its mock folder was replaced by another mock", "nuts",
         [*TINY, *CHAIN, "inference.num_samples=8", f"mock={w / 'swap_here'}", f"run_dir={ext}"], [ext],
         prepare=lambda: (copy(chain, ext), copy(mock2, w / "swap_here"), _set_mock(ext, w / "swap_here", mock)))
    case("swapped data", "extend a chain with its mock's path spelled with a trailing slash", "nuts",
         [*TINY, *CHAIN, "inference.num_samples=8", f"mock={mock}/", f"run_dir={ext}"], [ext],
         prepare=lambda: copy(chain, ext))
    # ---- checkpoints
    def truncate(steps):
        def prep():
            copy(chain, ext)
            for s in steps(ext):
                for p in (ext / "checkpoints" / str(s) / "state").rglob("*"):
                    if p.is_file() and p.stat().st_size > 64:
                        p.write_bytes(p.read_bytes()[: p.stat().st_size // 3])
        return prep

    case("checkpoints", "the newest checkpoint truncated, then extend", "nuts",
         [*TINY, *CHAIN, "inference.num_samples=8", f"mock={mock}", f"run_dir={ext}"], [ext],
         prepare=truncate(lambda r: [max(int(p.name) for p in (r / "checkpoints").iterdir() if p.name.isdigit())]))
    case("checkpoints", "every checkpoint truncated, then extend", "nuts",
         [*TINY, *CHAIN, "inference.num_samples=8", f"mock={mock}", f"run_dir={ext}"], [ext],
         prepare=truncate(lambda r: [int(p.name) for p in (r / "checkpoints").iterdir() if p.name.isdigit()]))
    case("checkpoints", "resume with another model config", "nuts",
         [*TINY, *CHAIN, "inference.num_samples=8", "lensing.n_planes=4", f"mock={mock}", f"run_dir={ext}"], [ext],
         prepare=lambda: copy(chain, ext))
    # ---- another command's directory
    for cmd, target, extra in [("nuts", mapr, [*CHAIN, f"mock={mock}"]), ("map", chain, [f"mock={mock}"]),
                               ("mock", chain, []), ("nuts", mock, [*CHAIN, f"mock={mock}"]),
                               ("map", mapr, [f"mock={mock}"])]:
        what = (f"fli-{cmd} run_dir=<a {'finished fli-map' if target == mapr and cmd == 'map' else target.name} "
                f"run>")
        case("another command's directory", what, cmd, [*TINY, *extra, f"run_dir={target}"], [target])
    # ---- the file system
    afile = w / "afile"
    afile.write_text("x")
    case("file system", "run_dir under a regular file", "mock", [*TINY, f"run_dir={afile / 'run'}"], [afile])
    locked = w / "locked"
    locked.mkdir(exist_ok=True)
    case("file system", "run_dir in an immutable directory (chattr +i)", "mock",
         [*TINY, f"run_dir={locked / 'run'}"], [locked], prepare=lambda: subprocess.run(["chattr", "+i", str(locked)]))
    disk = w / "disk"
    disk.mkdir(exist_ok=True)
    case("file system", "a full disk (a 256 KiB tmpfs)", "mock", [*TINY, f"run_dir={disk / 'run'}"], [disk],
         prepare=lambda: subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)]))

    rows = []
    for i, (group, what, cmd, args, watch, prepare, env, _) in enumerate(cases):
        for p in (new, diag):
            shutil.rmtree(p, ignore_errors=True)
        if prepare is not None:
            prepare()
        before = snapshot(watch)
        code, last, secs = run(cmd, args, env)
        after = snapshot(watch)
        left = left_behind(before, after, watch)
        rows.append({"group": group, "what": what, "command": f"fli-{cmd}", "exit": code, "message": last,
                     "left": left, "seconds": secs})
        print(f"[{i + 1}/{len(cases)}] {group}: {what}: exit {code} ({secs:.0f} s): {last[:150]} | {left}",
              flush=True)
        if "chattr" in what:
            subprocess.run(["chattr", "-i", str(locked)])
        if "tmpfs" in what:
            subprocess.run(["umount", str(disk)])
    write_doc(rows, a.out)
    return 0


def _set_mock(run_dir: Path, new_mock: Path, old_mock: Path) -> None:
    """Make a copied chain's records name ``new_mock`` as if it had been made there: the case
    of a mock folder replaced under the same path."""
    for f in [run_dir / "config.yaml", run_dir / "fli-run.json", *run_dir.glob("checkpoints/*/meta/metadata")]:
        f.write_text(f.read_text().replace(str(old_mock), str(new_mock)))


def write_doc(rows: list[dict], out: Path) -> None:
    def cell(s):
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["# Bad input and faults: what each command does", "",
             "Every row was run as a user would, by `python -m scripts.studies.reliability_catalogue` (tiny experiment,",
             "on real runs it makes first or damaged copies of them), which writes this file. **Exit**: 0",
             "done, 2 refused (bad input or damaged data: one line on stderr), 3/4 fli-diagnose's warn/fail",
             "verdicts, 1 a crash. **Left behind**: files added, removed or changed in the directories the",
             "command was given (`.hydra/` is Hydra's record of the call; it is restored after a refusal).",
             "", "| # | case | command | exit | message (last line on stderr) | left behind |",
             "| --- | --- | --- | --- | --- | --- |"]
    for i, r in enumerate(rows, 1):
        lines.append(f"| {i} | {cell(r['group'])}: {cell(r['what'])} | {r['command']} | {r['exit']} | "
                     f"{cell(r['message']) or '(none)'} | {cell(r['left'])} |")
    crashes = [r for r in rows if r["exit"] not in (0, 2, 3, 4)]
    lines += ["", f"{len(rows)} cases; {sum(r['exit'] == 2 for r in rows)} refused with status 2, "
                  f"{sum(r['exit'] == 0 for r in rows)} done, {len(crashes)} crashed.", ""]
    out.write_text("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    raise SystemExit(main())
