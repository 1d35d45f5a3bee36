"""fli-pipeline as a user runs it: every stage into its own run directory; a second command on the
same run_dir while the chains sample refuses in one line naming the first; a kill -9 of the first,
then the same command: it takes the directory over, passes the finished stages over untouched,
and the chain continues after its last complete chunk; the exit status is the diagnosis's."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from fli.infer.sample.run_store import complete_chunks
from tests.helpers.posterior import SMALL
from tests.helpers.processes import ROOT

# a small model, a short MAP without its Laplace step, a chain long enough to be stopped in
ARGS = [*SMALL, "inference.kernel=nuts", "inference.chains_per_run=1", "inference.map.steps=15", "inference.map.laplace=false", "inference.num_warmup=6",
        "inference.num_samples=120", "inference.chunk=4", "inference.field_thin=4", "inference.max_tree_depth=3"]


def _pipeline(run_dir):
    return [sys.executable, "-m", "fli.cli.pipeline", *ARGS, f"run_dir={run_dir}"]


@pytest.mark.slow(seconds=160)  # a mock, a MAP, a chain's programs compiled; three process start-ups
def test_a_pipeline_killed_while_sampling_continues_where_it_stopped(tmp_path):
    run = tmp_path / "pipe"
    first = subprocess.Popen(_pipeline(run), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.time()
        while time.time() - t0 < 900 and first.poll() is None and not complete_chunks(run / "sample"):
            time.sleep(0.05)
        assert first.poll() is None and complete_chunks(run / "sample"), first.stderr.read()[-3000:]
        second = subprocess.run(_pipeline(run), cwd=ROOT, capture_output=True, text=True, timeout=300)
        err = [line for line in second.stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
        assert second.returncode == 2 and len(err) == 1, second.stderr[-3000:]
        assert err[0].startswith(f"fli-pipeline: error: run_dir {run} is in use by fli-pipeline (pid {first.pid}"), err
        assert first.poll() is None, "the refused command stopped the one that holds the directory"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    done = complete_chunks(run / "sample")
    chunks = -(-(6 + 120) // 4)
    assert done[-1] < chunks - 1, "the chain finished before it was killed"
    # the earlier stages are ordinary run directories of their commands
    assert json.loads((run / "mock" / "fli-run.json").read_text())["command"] == "fli-mock"
    assert json.loads((run / "map" / "fli-run.json").read_text())["command"] == "fli-map"
    kept = {p: p.stat().st_mtime_ns for p in (run / "mock" / "mock.zarr" / "COMPLETE", run / "map" / "map.json")}

    again = subprocess.run(_pipeline(run), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode in (0, 3, 4), again.stderr[-3000:]  # a verdict, not bad input or a crash
    log = again.stderr
    assert "stage mock already done" in log and "stage map already done" in log, log[-3000:]
    assert f"resuming after chunk {done[-1]}" in log and "taken over from fli-pipeline" in log, log[-3000:]
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # not made again
    assert complete_chunks(run / "sample") == list(range(chunks))
    diag = json.loads((run / "diagnose" / "diagnostics.json").read_text())
    assert diag["exit_status"] == again.returncode and (run / "diagnose" / "report.html").is_file()
    cost = json.loads((run / "pipeline.json").read_text())  # what this start did, and each run's gradients
    assert cost["exit_status"] == again.returncode
    assert [cost["stages"][s]["status"] for s in ("mock", "map", "sample", "diagnose")] == [
        "done before", "done before", "run", "run"]
    assert cost["stages"]["map"]["gradient_evals"] == json.loads((run / "map" / "map.json").read_text())["grad_evals"]
    nuts = json.loads((run / "sample" / "nuts.json").read_text())
    assert cost["stages"]["sample"]["gradient_evals"] == nuts["gradient_evals"] > 0


def test_fli_samples_kernel_is_mclmc_unless_the_command_line_says_otherwise_and_fli_nuts_stays_nuts():
    from fli.cli import sample
    from fli.cli.compose import compose

    assert sample.DEFAULTS == {"inference.kernel": "mclmc"}
    assert sample.with_defaults(["experiment=tiny"], sample.DEFAULTS) == ["inference.kernel=mclmc", "experiment=tiny"]
    assert sample.with_defaults(["inference.kernel=nuts"], sample.DEFAULTS) == ["inference.kernel=nuts"]
    cfg, _ = compose(["experiment=tiny"])  # what fli-nuts composes: the config's own kernel
    assert cfg.inference.kernel == "nuts"


def test_the_pipelines_chains_are_four_of_mclmcs_unless_the_command_line_says_otherwise():
    from fli.cli.pipeline import with_defaults

    four = "inference.chains_per_run=4"
    assert with_defaults(["experiment=tiny"]) == ["inference.kernel=mclmc", four, "experiment=tiny"]
    assert with_defaults(["inference.kernel=nuts"]) == [four, "inference.kernel=nuts"]
    assert with_defaults(["-m", "inference.kernel=nuts,hmc", "inference.chains_per_run=1"]) == [
        "-m", "inference.kernel=nuts,hmc", "inference.chains_per_run=1"]


def test_pipeline_json_counts_each_runs_gradients_muse_included(tmp_path):
    from fli.pipeline import stage_costs

    (tmp_path / "map").mkdir()
    (tmp_path / "sample").mkdir()
    (tmp_path / "map" / "map.json").write_text(json.dumps({"grad_evals": 40, "muse": {"grad_evals": 900,
                                                                                      "grad_evals_this_run": 300}}))
    (tmp_path / "sample" / "nuts.json").write_text(json.dumps({"gradient_evals": 1200}))
    costs = {"mock": {"status": "done before", "seconds": 0.0}, "map": {"status": "run", "seconds": 5.0},
             "sample": {"status": "run", "seconds": 9.0}}
    out = stage_costs(tmp_path, costs, 14.0, {"verdict": "warn", "exit_status": 3})
    assert out["stages"]["map"]["gradient_evals"] == 940 and out["stages"]["sample"]["gradient_evals"] == 1200
    assert out["exit_status"] == 3 and out["stages"]["mock"] == costs["mock"] and "gradient_evals" not in costs["map"]

