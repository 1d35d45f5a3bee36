"""The long studies' drivers (scripts/studies/study.py, scripts/studies/muse_calibration.py).

* Partial records: an analysis cut short on one machine resumes on another from the fits' scores
  kept in the committed folder, and only on the same mock and overrides. (The end-to-end resume,
  fli-map reading the restored scores, is tested by tests/infer/muse/test_muse.py's resume tests;
  this checks what the driver carries across.)
* A driver stopped by a signal stops the command it runs, so that no orphan shares a run
  directory with the next driver's command, and saves its progress on the way out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.processes import ROOT
from tests.helpers.scripts import load_script

OVERRIDES = ["experiment=tiny", "survey.sigma_e=0.05"]


@pytest.fixture(scope="module")
def cal():
    return load_script("studies/muse_calibration")


def _mock(path: Path, fingerprint: str) -> Path:
    (path / "mock.zarr").mkdir(parents=True)
    (path / "mock.zarr" / "zarr.json").write_text(json.dumps({"attributes": {"fli_fingerprint": fingerprint}}))
    return path


def _run(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "muse_scores.jsonl").write_text('{"name": "data", "theta": [0.0, 0.0]}\n')
    (path / "muse_iterations.jsonl").write_text('{"iteration": 0}\n')
    return path


def test_saved_then_restored_on_a_new_machine(cal, tmp_path):
    mock, keep = _mock(tmp_path / "old" / "mock_003", "abc"), tmp_path / "keep"
    cal._save_partial(_run(tmp_path / "old" / "map_003"), mock, keep, 3, OVERRIDES)
    kept = keep / "partial_003"
    assert sorted(p.name for p in kept.iterdir()) == ["muse_iterations.jsonl", "muse_scores.jsonl", "partial.json"]
    new_mock, new_run = _mock(tmp_path / "new" / "mock_003", "abc"), tmp_path / "new" / "map_003"
    cal._restore_partial(new_run, new_mock, keep, 3, OVERRIDES)
    assert (new_run / "muse_scores.jsonl").read_text() == (kept / "muse_scores.jsonl").read_text()
    assert (new_run / "muse_iterations.jsonl").exists()


@pytest.mark.parametrize("fingerprint, overrides, what", [("xyz", OVERRIDES, "mock"),
                                                          ("abc", [*OVERRIDES, "inference.map.muse.n_sims=8"],
                                                           "overrides")])
def test_not_restored_onto_another_mock_or_config(cal, tmp_path, capsys, fingerprint, overrides, what):
    keep = tmp_path / "keep"
    cal._save_partial(_run(tmp_path / "old" / "map_000"), _mock(tmp_path / "old" / "mock_000", "abc"), keep, 0,
                      OVERRIDES)
    new_run = tmp_path / "new" / "map_000"
    cal._restore_partial(new_run, _mock(tmp_path / "new" / "mock_000", fingerprint), keep, 0, overrides)
    assert not (new_run / "muse_scores.jsonl").exists()
    assert f"fits of another {what}" in capsys.readouterr().out


def test_a_finished_run_is_not_kept_as_partial(cal, tmp_path):
    run = _run(tmp_path / "map_001")
    (run / "map.json").write_text("{}")
    cal._save_partial(run, _mock(tmp_path / "mock_001", "abc"), tmp_path / "keep", 1, OVERRIDES)
    assert not (tmp_path / "keep" / "partial_001").exists()


def test_each_mock_is_analysed_with_its_own_seed(cal, tmp_path, monkeypatch):
    """fli-map's seed sets MUSE's simulations: one seed for every mock would give every mock the
    same draw of J and of the simulations' mean score (stop 49 found the calibration's 16 read J
    at 0.4x). The mock's seed and the analysis's are the mock's index, and a partial kept under
    another seed is not restored."""
    calls = []

    def fake_run(argv, log, core, every=None):
        calls.append(argv)
        run_dir = Path(next(a for a in argv if a.startswith("run_dir="))[8:])
        if argv[0] == "fli.cli.mock":
            _mock(run_dir, "abc")
            (run_dir / "mock.zarr" / "COMPLETE").write_text("")
        else:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "map.json").write_text("{}")

    monkeypatch.setattr(cal, "_run", fake_run)
    out, keep = tmp_path / "study", tmp_path / "keep"
    out.mkdir()
    # a partial of mock 1 kept under the old protocol (no seed among the overrides)
    cal._save_partial(_run(tmp_path / "old" / "map_001"), _mock(tmp_path / "old" / "mock_001", "abc"), keep, 1,
                      OVERRIDES)
    cal.analyse(out, 2, OVERRIDES, keep=keep)
    seeds = [[a for a in argv if a.startswith("seed=")] for argv in calls]
    assert [argv[0] for argv in calls] == ["fli.cli.mock", "fli.cli.map"] * 2
    assert seeds == [["seed=0"], ["seed=0"], ["seed=1"], ["seed=1"]]
    assert not (out / "map_001" / "muse_scores.jsonl").exists()


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_a_stopped_driver_stops_its_command(tmp_path):
    driver = (f"from pathlib import Path; "
              f"from scripts.studies.study import run_logged; "
              f"run_logged(['timeit', '-n', '1', 'import time; time.sleep(120)'], Path({str(tmp_path / 'log')!r}), "
              f"every=(100.0, lambda: Path({str(tmp_path / 'saved')!r}).write_text('x')))")
    proc = subprocess.Popen([sys.executable, "-c", driver], cwd=ROOT)  # the scripts run from the repository root
    t0 = time.monotonic()
    while not (kids := _children(proc.pid)) and time.monotonic() - t0 < 30:
        time.sleep(0.1)
    assert kids, "the driver never started its command"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) != 0
    for pid in kids:  # reaped by the driver, so gone from the table (not a zombie)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert (tmp_path / "saved").exists()  # progress saved on the way out, before its 100 s period came round


def test_a_driver_off_the_accelerator_lends_it_to_its_commands(tmp_path, monkeypatch):
    """On a TPU host one process at a time can hold the chip: the driver runs with
    JAX_PLATFORMS=cpu and its commands get STUDY_JAX_PLATFORMS; ``core`` may be a taskset list."""
    study = load_script("studies/study")
    (tmp_path / "envprobe.py").write_text("import os, sys\nprint(os.environ.get('JAX_PLATFORMS'), "
                                          "sorted(os.sched_getaffinity(0)), 'STUDY_JAX_PLATFORMS' in os.environ)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("STUDY_JAX_PLATFORMS", "tpu,cpu")
    cores = sorted(os.sched_getaffinity(0))
    study.run_logged(["envprobe"], tmp_path / "log", core=f"{cores[0]}-{cores[-1]}")
    monkeypatch.delenv("STUDY_JAX_PLATFORMS")
    study.run_logged(["envprobe"], tmp_path / "log", core=cores[0])
    lines = (tmp_path / "log").read_text().splitlines()
    assert lines == [f"tpu,cpu {list(range(cores[0], cores[-1] + 1))} False", f"cpu {[cores[0]]} False"]


def test_calibration_report_lists_each_mocks_pulls_and_draws_them(cal, tmp_path):
    """The per-mock pulls behind the summary: their mean and sd are the summary's, and the joint
    MAP's are read straight off each map.json (estimate, truth, marginal Laplace sd)."""
    bench = Path(__file__).resolve().parents[2] / "docs" / "bench" / "muse_calibration_pm_tsc"
    keep = tmp_path / "keep"
    keep.mkdir()
    for i in (0, 1):
        (keep / f"map_{i:03d}.json").write_bytes((bench / f"map_{i:03d}.json").read_bytes())
    overrides = [*OVERRIDES, "simulation.assignment=tsc", "inference.map.muse.n_sims=16"]
    res = cal.report(tmp_path / "study", overrides, keep)
    for name in cal.PARAMS:
        pulls = [res["per_mock"][i][name]["muse_pull"] for i in ("0", "1")]
        assert res["params"][name]["muse_pull_mean"] == pytest.approx(sum(pulls) / 2)
        assert res["params"][name]["muse_pull_sd"] == pytest.approx(abs(pulls[0] - pulls[1]) / 2 ** 0.5)
    d = json.loads((keep / "map_001.json").read_text())
    # these records predate the posterior's mean given the score: their theta_z is the root, and
    # its pull, recomputed, is the one fli-map wrote then (the same pushforward; 200000 draws do
    # not enter the mean)
    for name in cal.PARAMS:
        assert res["per_mock"]["1"][name]["root_pull"] == pytest.approx(d["muse"]["pull"][name], abs=1e-6)
    want = (d["params"]["sigma8"] - d["truth"]["sigma8"]) / d["laplace"]["marginal"]["std"]["sigma8"]
    assert res["per_mock"]["1"]["sigma8"]["joint_pull"] == pytest.approx(want)
    assert res["per_mock"]["1"]["S8"]["joint_pull"] is None  # no Laplace sd of S8 in map.json
    png = cal.figure(res, tmp_path / "pulls.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_driver_stopped_while_its_command_starts_stops_it_too(tmp_path):
    """SIGTERM landing inside Popen (after the fork, before Popen returns: a window that load
    widens) used to raise out of Popen and leave the command running unowned. Here the signal
    is sent from inside Popen itself, deterministically."""
    kid = tmp_path / "kid"
    driver = (f"import os, signal, subprocess, sys; from pathlib import Path\n"
              f"class Late(subprocess.Popen):\n"
              f"    def __init__(self, *a, **k):\n"
              f"        super().__init__(*a, **k)\n"
              f"        Path({str(kid)!r}).write_text(str(self.pid))\n"
              f"        os.kill(os.getpid(), signal.SIGTERM)\n"
              f"subprocess.Popen = Late\n"
              f"from scripts.studies.study import run_logged\n"
              f"run_logged(['timeit', '-n', '1', 'import time; time.sleep(120)'], Path({str(tmp_path / 'log')!r}))\n")
    proc = subprocess.run([sys.executable, "-c", driver], cwd=ROOT, timeout=90)
    assert proc.returncode != 0
    with pytest.raises(ProcessLookupError):  # terminated and reaped by the driver before it exited
        os.kill(int(kid.read_text()), 0)


def test_the_pull_figure_labels_at_most_ten_mocks_and_holds_every_pull(cal):
    """The 50-mock linear figure labelled every mock, and the labels ran into one another; and its
    y axis stopped at 25 where the joint MAP's sigma8 pulls reach 40, drawing them on the frame.
    The ticks are counted after a draw, for 3 mocks and for 50 (issue 21's linear calibration)."""
    from fli.plots import pyplot

    plt = pyplot()
    for n in (3, 50):
        per = {"muse_pull": 0.5, "root_pull": 0.4, "joint_pull": 40.0}
        stats = {"muse_pull_mean": 0.0, "muse_pull_sd": 1.0, "root_pull_mean": 0.0, "root_pull_sd": 1.0,
                 "joint_pull_mean": 2.0, "joint_pull_sd": 0.0}
        res = {"mocks": n, "overrides": ["experiment=tiny"], "params": {p: stats for p in cal.PARAMS},
               "per_mock": {str(i): {p: per for p in cal.PARAMS} for i in range(n)}}
        for i in range(n):  # as in the reports: no joint pull for S8, and the axes are shared
            res["per_mock"][str(i)]["S8"] = {**per, "joint_pull": None}
        fig = cal.draw_pulls(res)
        fig.canvas.draw()
        for ax in fig.axes:
            shown = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
            assert 2 <= len(shown) <= 11, (n, shown)
            assert all(float(t).is_integer() for t in shown)  # mocks are numbered
            assert ax.get_ylim()[1] > 40.0  # every pull inside the frame
        plt.close(fig)
