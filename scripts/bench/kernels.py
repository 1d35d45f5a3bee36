#!/usr/bin/env python
"""Sampling kernels side by side on one mock: ESS per 1000 gradient evaluations, R-hat, means.

Each named setting runs ``--chains`` chains of ``fli-sample`` (seeds 0 .. chains-1), each its
own process, ``--jobs`` at a time, every process pinned to one core with XLA single-threaded
(two processes per core share it better than one process on both: docs/benchmarks.md, "fli-nuts
on the tiny mock"), under ``nice -n 19`` (tests and CI keep the cores). Then ``fli-diagnose``
combines each setting's chains, and the table (markdown, and JSON with ``--json``) gives per
parameter the bulk and tail ESS per 1000 post-warm-up gradient evaluations, R-hat, the
posterior mean and sd, and per setting the warm-up's and the draws' gradient evaluations and
the chains' own sampling time.

Resumable: started again with the same ``--out``, every run continues from its last complete
chunk (fli-sample's own resume) and a finished one is passed over, so a long study can be
stopped and resumed across sessions.

    fli-mock experiment=tiny run_dir=/tmp/kern/mock
    python -m scripts.bench.kernels --mock /tmp/kern/mock --out /tmp/kern --chains 4 \\
        --overrides experiment=tiny inference.chunk=100 inference.field_thin=100 \\
        --setting "mclmc_variance=inference.kernel=mclmc inference.num_warmup=400 inference.num_samples=1000" \\
        --setting "mclmc_autocorr=inference.kernel=mclmc inference.mclmc_length=autocorrelation ..." \\
        --json docs/bench/kernels_tiny.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ("Omega_c", "sigma8", "S8")


def _runs(out: Path, name: str, chains: int) -> list[Path]:
    return [out / name / f"chain_{c}" for c in range(chains)]


def sample(out: Path, settings: dict[str, list[str]], chains: int, mock: str, common: list[str], jobs: int,
           cores: int, first_core: int = 0) -> None:
    """Run (or resume) every chain of every setting, ``jobs`` processes at a time."""
    todo = [(name, c, run) for name in settings for c, run in enumerate(_runs(out, name, chains))]
    running: list[tuple[subprocess.Popen, str, Path]] = []
    slot = 0
    while todo or running:
        while todo and len(running) < jobs:
            name, c, run = todo.pop(0)
            run.parent.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ, XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
            core = str(first_core + slot % cores)
            cmd = ["nice", "-n", "19", "taskset", "-c", core, sys.executable, "-m", "fli.cli.sample",
                   *common, *settings[name], f"mock={mock}", f"seed={c}", f"run_dir={run}"]
            slot += 1
            log = open(run.parent / f"chain_{c}.log", "a")  # noqa: SIM115 (closed with the process)
            print(f"[{time.strftime('%H:%M:%S')}] start {name} chain {c}: {shlex.join(cmd[7:])}", flush=True)
            running.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), name, run))
        time.sleep(5)
        for p, name, run in list(running):
            if p.poll() is not None:
                running.remove((p, name, run))
                print(f"[{time.strftime('%H:%M:%S')}] {name} {run.name}: exit {p.returncode}", flush=True)
                if p.returncode:
                    raise SystemExit(f"{run}: fli-sample failed (exit {p.returncode}); see {run.parent / run.name}.log")


def diagnose(out: Path, name: str, chains: int) -> dict:
    """fli-diagnose of one setting's chains; its report."""
    runs = _runs(out, name, chains)
    d = out / name / "diagnose"
    cmd = [sys.executable, "-m", "fli.cli.diagnose", f"runs=[{','.join(str(r) for r in runs)}]", f"run_dir={d}",
           "diagnose.figures=false"]
    if d.exists():
        import shutil  # noqa: PLC0415

        shutil.rmtree(d)
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode not in (0, 3, 4):  # fli-diagnose's pass, warn and fail all come with a report
        raise SystemExit(f"fli-diagnose of {name} failed (exit {p.returncode}): {p.stderr.strip()[-2000:]}")
    report = json.loads((d / "diagnostics.json").read_text())
    report["verdict_exit_status"] = p.returncode
    return report


def row(name: str, report: dict, out: Path, chains: int) -> dict:
    """One setting's numbers from its fli-diagnose report and its chains' nuts.json."""
    eff, conv = report["efficiency"], report["params"]
    summaries = [json.loads((r / "nuts.json").read_text()) for r in _runs(out, name, chains)]
    total = sum(s["gradient_evals"] for s in summaries)
    r = {"setting": name, "chains": chains, "draws_per_chain": report["draws_per_chain"], "verdict": report["verdict"],
         "post_warmup_gradient_evals": eff["gradient_evals"], "sampling_seconds": eff["seconds"],
         "warmup_gradient_evals": total - eff["gradient_evals"],
         "step_size": [s["step_size"] for s in summaries], "params": {}}
    for k in PARAMS:
        c, e = conv[k], eff["params"][k]
        r["params"][k] = {"mean": c["mean"], "sd": c["sd"], "rhat": c["rhat"], "ess_bulk": c["ess_bulk"],
                          "ess_tail": c["ess_tail"], "bulk_per_1000": e["ess_bulk_per_1000_grads"],
                          "tail_per_1000": e["ess_tail_per_1000_grads"]}
    proj = report.get("projections")  # the runs recorded the field's data-constrained projections
    if proj and proj.get("ess_bulk_min") is not None and eff["gradient_evals"] > 0:
        r["projections"] = {"count": proj["count"], "rhat_max": proj["rhat_max"], "ess_bulk_min": proj["ess_bulk_min"],
                            "ess_tail_min": proj["ess_tail_min"],
                            "bulk_min_per_1000": 1000.0 * proj["ess_bulk_min"] / eff["gradient_evals"]}
    return r


def table(rows: list[dict]) -> str:
    head = ("| setting | param | mean +- sd | R-hat | bulk / tail ESS | bulk / tail ESS per 1000 grads |\n"
            "| --- | --- | --- | --- | --- | --- |")
    lines = [head]
    for r in rows:
        for k, p in r["params"].items():
            lines.append(f"| {r['setting']} | {k} | {p['mean']:.3f} +- {p['sd']:.3f} | {p['rhat']:.3f} | "
                         f"{p['ess_bulk']:.0f} / {p['ess_tail']:.0f} | {p['bulk_per_1000']:.2f} / "
                         f"{p['tail_per_1000']:.2f} |")
        if "projections" in r:
            p = r["projections"]
            lines.append(f"| {r['setting']} | field, {p['count']} data projections (worst) | | {p['rhat_max']:.3f} | "
                         f"{p['ess_bulk_min']:.0f} / {p['ess_tail_min']:.0f} | {p['bulk_min_per_1000']:.2f} / |")
    lines.append("")
    for r in rows:
        lines.append(f"- {r['setting']}: fli-diagnose's verdict {r['verdict']}; {r['chains']} chains x "
                     f"{r['draws_per_chain']} draws; gradient evaluations "
                     f"{r['warmup_gradient_evals']:.0f} in the warm-ups, {r['post_warmup_gradient_evals']:.0f} after; "
                     f"the chains' own sampling time {r['sampling_seconds']:.0f} s")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mock", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=4, help="processes at a time (default 4: two per core)")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--first-core", type=int, default=0, help="pin to cores first-core .. first-core + cores - 1")
    ap.add_argument("--overrides", nargs="*", default=[], help="config overrides of every setting")
    ap.add_argument("--setting", action="append", required=True, metavar="NAME=OVERRIDES",
                    help="a named setting: NAME=space-separated overrides (repeatable)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--report-only", action="store_true", help="diagnose what is there; run nothing")
    a = ap.parse_args(argv)
    settings = {}
    for s in a.setting:
        name, _, over = s.partition("=")
        if not name or not over:
            ap.error(f"--setting {s!r}: give NAME=OVERRIDES")
        settings[name] = shlex.split(over)
    if not a.report_only:
        sample(a.out, settings, a.chains, a.mock, a.overrides, a.jobs, a.cores, a.first_core)
    rows = [row(name, diagnose(a.out, name, a.chains), a.out, a.chains) for name in settings]
    print(table(rows))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"settings": settings, "overrides": a.overrides, "mock": a.mock,
                                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
