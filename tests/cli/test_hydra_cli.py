"""Hydra's conventions on every console script: hydra.run.dir, run_dir winning over it, -m
sweeps into hydra.sweep.dir, launcher plugins (basic, submitit_local, SLURM's sbatch file),
nothing left behind by a refused config, one run directory for all processes.

Most runs use tests/helpers/hydra_probe.py, a console script on the same main_wrapper whose body
takes milliseconds; the fli-mock runs that compute a mock are marked slow (~25 s each).
"""

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import tests.helpers.hydra_probe as probe
from fli.cli.common import main_wrapper
from tests.helpers.posterior import SMALL
from tests.helpers.processes import child_env, free_port, launch

PROBE = [sys.executable, "-m", "tests.helpers.hydra_probe"]
STAMP = r"\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}-\d{3}"  # outputs/<command>/<date>_<time>, milliseconds


def fli_mock() -> list[str]:
    """The installed console script (as a user runs it), else the module."""
    exe = Path(sys.executable).parent / "fli-mock"
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "fli.cli.mock"]


def run(argv, cwd, timeout=300):
    env = child_env()
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob("probe.*.json"))]


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def assert_hydra_files(run_dir: Path) -> None:
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        assert (run_dir / ".hydra" / name).is_file(), name


# --------------------------------------------------------------------------- single runs


def test_hydra_run_dir_is_honoured_and_fli_logs_still_show(tmp_path):
    res = run([*PROBE, "seed=3", "hydra.run.dir=runs/a"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    [rec] = records(tmp_path / "runs" / "a")
    assert rec["seed"] == 3 and rec["run_dir"] == "runs/a"
    assert rec["cwd"] == str(tmp_path)  # hydra.job.chdir stays false: relative paths mean what was typed
    assert_hydra_files(tmp_path / "runs" / "a")
    assert yaml.safe_load((tmp_path / "runs" / "a" / ".hydra" / "overrides.yaml").read_text()) == ["seed=3"]
    # Hydra's logging config leaves fli's stderr lines alone
    assert re.search(r"\d\d:\d\d:\d\d fli INFO probe progress: seed 3", res.stderr), res.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_run_dir_wins_over_hydra_run_dir(tmp_path):
    res = run([*PROBE, "run_dir=mine", "hydra.run.dir=theirs"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    [rec] = records(tmp_path / "mine")
    assert rec["run_dir"] == "mine"
    assert_hydra_files(tmp_path / "mine")  # Hydra's .hydra/ follows run_dir too
    assert not (tmp_path / "theirs").exists()


def test_default_run_dir_is_outputs_command_timestamp(tmp_path):
    res = run(PROBE, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    [d] = list((tmp_path / "outputs" / "probe").iterdir())
    assert re.fullmatch(STAMP, d.name), d.name
    assert records(d)[0]["run_dir"] == f"outputs/probe/{d.name}"
    assert_hydra_files(d)


# --------------------------------------------------------------------------- sweeps


def test_multirun_two_seeds_in_the_default_sweep_dir(tmp_path):
    res = run([*PROBE, "-m", "seed=0,1"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    [sweep] = list((tmp_path / "multirun" / "probe").iterdir())
    assert re.fullmatch(STAMP, sweep.name), sweep.name
    assert (sweep / "multirun.yaml").is_file()
    for i in (0, 1):
        [rec] = records(sweep / str(i))
        assert rec["seed"] == i and Path(rec["run_dir"]) == sweep / str(i)  # the job's run_dir is its subdir
        assert_hydra_files(sweep / str(i))
    assert "probe progress: seed 1" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["multirun"]


def test_hydra_sweep_dir_and_subdir_are_honoured(tmp_path):
    res = run([*PROBE, "--multirun", "seed=4,5", "hydra.sweep.dir=sweeps/s", "hydra.sweep.subdir=seed${seed}"],
              tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    sweep = tmp_path / "sweeps" / "s"
    assert sorted(p.name for p in sweep.iterdir()) == ["multirun.yaml", "seed4", "seed5"]
    assert [r["seed"] for r in records(sweep / "seed5")] == [5]


def test_submitit_local_launcher_runs_a_two_job_sweep(tmp_path):
    res = run([*PROBE, "-m", "seed=0,1", "hydra/launcher=submitit_local", "hydra.sweep.dir=sw"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    sweep = tmp_path / "sw"
    recs = [records(sweep / str(i)) for i in (0, 1)]
    assert [r[0]["seed"] for r in recs] == [0, 1]
    assert recs[0][0]["pid"] != recs[1][0]["pid"]  # one process per job, started by submitit
    assert (sweep / ".submitit").is_dir()  # submitit's own logs of each job
    assert_hydra_files(sweep / "1")


def test_slurm_launcher_writes_a_multi_node_gpu_sbatch_file(tmp_path, monkeypatch):
    """conf/hydra/launcher/slurm.yaml through the plugin and submitit up to sbatch, which is
    faked: it keeps the submission file and fails, so nothing is queued."""
    bin_dir, kept = tmp_path / "bin", tmp_path / "job.sbatch"
    bin_dir.mkdir()
    for name, text in (("srun", "exit 0\n"), ("sbatch", f'cp "$1" {kept}\necho "sbatch: no cluster" >&2\nexit 1\n')):
        (bin_dir / name).write_text("#!/bin/sh\n" + text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match="sbatch"):
        main_wrapper("probe", probe.body, ["-m", "seed=0,1", "hydra/launcher=slurm", "hydra.launcher.partition=gpu",
                                           "distributed.pdims=[2,4]", "hydra.sweep.dir=sw"])
    text = kept.read_text()
    for line in ("--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4", "--cpus-per-task=8", "--partition=gpu",
                 "--time=120", "--array=0-1"):
        assert f"#SBATCH {line}" in text, (line, text)
    assert "submitit.core._submit" in text and "srun" in text


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("args,needle", [
    (["experiment=tiny", "simulation.nope=1"], "simulation.nope"),
    (["-m", "seed=0,1", "experiment=tiny", "simulation.nope=1"], "simulation.nope"),
])
def test_bad_key_exits_2_with_one_line_and_leaves_nothing(tmp_path, args, needle):
    res = run([*fli_mock(), *args], tmp_path)
    assert res.returncode == 2
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fli-mock: error:") and needle in err[0], err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,needle", [
    (["-m", "cosmology.Omega_c=0.25,-1"], "cosmology.Omega_c must be in (0, 1), got -1.0 (job #1"),
    (["-m", "seed=0,1", "run_dir=x"], "run_dir=x is a single run's directory"),
    (["-m", "distributed.pdims=[1,1],[4,4]"], "(job #1: distributed.pdims=[4,4])"),
    (["-m", "seed=0,1", "hydra.nope=1"], "hydra.nope"),
    (["hydra.job.chdir=true"], "hydra.job.chdir must stay false"),
    (["seed=0,1"], "a sweep: add -m"),
    (["--info"], "unknown option --info"),
])
def test_bad_input_is_refused_before_hydra_writes(tmp_path, monkeypatch, capsys, args, needle):
    monkeypatch.chdir(tmp_path)
    assert main_wrapper("probe", probe.body, args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["name=refuse"], ["hydra.run.dir=a/b/c", "name=refuse"],
                                  ["-m", "seed=0,1", "name=refuse"], ["-m", "seed=2", "name=refuse",
                                                                      "hydra.sweep.dir=s/t"]])
def test_a_body_refusal_takes_back_what_hydra_wrote(tmp_path, monkeypatch, capsys, args):
    """The body validates after Hydra made the directory and its .hydra/: both go again."""
    monkeypatch.chdir(tmp_path)
    assert main_wrapper("probe", probe.body, args) == 2
    err = capsys.readouterr().err
    assert "name: refused on purpose" in err
    assert tree(tmp_path) == []


def test_a_refusal_after_the_body_wrote_keeps_its_work_and_hydra_record(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main_wrapper("probe", probe.body, ["run_dir=r", "name=refuse_late"]) == 2
    assert "refused after writing" in capsys.readouterr().err
    assert (tmp_path / "r" / "work.txt").read_text() == "results"
    assert_hydra_files(tmp_path / "r")  # the record of the config that made work.txt


def test_a_refused_rerun_keeps_the_run_it_refused_to_touch(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main_wrapper("probe", probe.body, ["run_dir=r", "seed=1"]) == 0
    old = {p.name: p.read_bytes() for p in (tmp_path / "r" / ".hydra").iterdir()}
    assert main_wrapper("probe", probe.body, ["run_dir=r", "seed=2", "name=refuse"]) == 2
    assert {p.name: p.read_bytes() for p in (tmp_path / "r" / ".hydra").iterdir()} == old  # restored
    assert records(tmp_path / "r")[0]["seed"] == 1


# --------------------------------------------------------------------------- --cfg, --help


def test_cfg_prints_the_composed_config_and_help_names_the_conventions(tmp_path):
    res = run([*fli_mock(), "--cfg", "experiment=tiny"], tmp_path)
    assert res.returncode == 0, res.stderr
    cfg = yaml.safe_load(res.stdout)
    assert cfg["name"] == "tiny" and cfg["simulation"]["mesh"] == [16, 16, 64]
    res = run([*fli_mock(), "--cfg", "hydra", "hydra.run.dir=somewhere"], tmp_path)
    assert res.returncode == 0, res.stderr
    h = yaml.safe_load(res.stdout)["hydra"]
    assert h["run"]["dir"] == "somewhere" and h["sweep"]["subdir"] == "${hydra.job.num}"
    assert h["job"]["chdir"] is False
    res = run([*fli_mock(), "--help"], tmp_path)
    assert res.returncode == 0 and "--multirun" in res.stdout and "hydra.sweep.dir" in res.stdout
    # the command's own help first: what it does and writes (its module's docstring, reST made plain)
    assert res.stdout.startswith("fli-mock: draw the truth") and "mock.zarr" in res.stdout and "``" not in res.stdout
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- processes


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", ["run", "sweep"])
def test_two_processes_agree_on_one_run_dir(tmp_path, mode):
    """Each process's ${now:} differs by microseconds: process 0's directory must win on both."""
    port = free_port()
    dirs = (["-m", "seed=0,1", "hydra.sweep.dir=d/${now:%H-%M-%S-%f}"] if mode == "sweep"
            else ["hydra.run.dir=d/${now:%H-%M-%S-%f}"])
    argv = [*PROBE, *dirs, "distributed.pdims=[1,2]", f"distributed.coordinator=127.0.0.1:{port}",
            "distributed.num_processes=2", "distributed.local_device_count=1"]
    res = launch(lambda i: [*argv, f"distributed.process_id={i}"], cwd=tmp_path, timeout=300)
    for rc, text in res:
        assert rc == 0, text[-3000:]
    [d] = list((tmp_path / "d").iterdir())
    for job in ([d / "0", d / "1"] if mode == "sweep" else [d]):
        recs = records(job)
        assert len(recs) == 2 and {r["processes"] for r in recs} == {2}, recs
        assert_hydra_files(job)


# --------------------------------------------------------------------------- fli-mock itself


@pytest.mark.slow(seconds=25)  # two tiny mocks
def test_fli_mock_sweep_writes_two_complete_runs(tmp_path):
    from fli.store.io import COMPLETE, load_mock

    res = run([*fli_mock(), "-m", "seed=0,1", *SMALL, "hydra.sweep.dir=sw"], tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "forward model done" in res.stderr and "mock written to" in res.stderr
    mocks = []
    for i in (0, 1):
        job = tmp_path / "sw" / str(i)
        for name in ("config.yaml", "summary.json", "kappa_maps.png", "matter_power.png", "kappa_cl.png"):
            assert (job / name).is_file(), (i, name)
        assert (job / "mock.zarr" / COMPLETE).is_file()
        assert_hydra_files(job)
        mocks.append(load_mock(job))
    assert mocks[0].config["seed"] == 0 and mocks[1].config["seed"] == 1
    assert not (mocks[0].white_noise == mocks[1].white_noise).all()


@pytest.mark.slow(seconds=25)  # two tiny mocks in two submitit processes
def test_fli_mock_submitit_local_sweep(tmp_path):
    from fli.store.io import COMPLETE

    res = run([*fli_mock(), "-m", "seed=0,1", *SMALL, "hydra/launcher=submitit_local", "hydra.sweep.dir=sw",
               "hydra.launcher.timeout_min=10"], tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    for i in (0, 1):
        assert (tmp_path / "sw" / str(i) / "mock.zarr" / COMPLETE).is_file(), i
    logs = "".join(p.read_text() for p in (tmp_path / "sw" / ".submitit").rglob("*_log.err"))
    assert "forward model done" in logs  # fli's progress lines reach each job's log


@pytest.mark.slow(seconds=15)
def test_fli_mock_hydra_run_dir_with_a_relative_path(tmp_path):
    res = run([*fli_mock(), *SMALL, "hydra.run.dir=runs/one"], tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "run directory runs/one" in res.stderr and "forward model done" in res.stderr
    from fli.store.io import COMPLETE

    assert (tmp_path / "runs" / "one" / "mock.zarr" / COMPLETE).is_file()
    assert_hydra_files(tmp_path / "runs" / "one")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_observation_names_the_data_and_mock_stays_its_alias(tmp_path, capsys):
    """observation=<dir> is the key mock= under the name a user's data has; both, naming two paths,
    are refused in one line before anything is written."""
    from fli.cli.common import observation_alias
    from fli.config import ConfigError

    assert observation_alias(["observation=/d", "seed=1"]) == ["mock=/d", "seed=1"]
    assert observation_alias(["mock=/d", "observation=/d"]) == ["mock=/d"]
    assert observation_alias(["mock=/d"]) == ["mock=/d"]
    with pytest.raises(ConfigError, match="observation= and mock= name one key"):
        observation_alias(["observation=/a", "mock=/b"])
    seen = []
    code = main_wrapper("probe", lambda cfg, resolved, run_dir, log: seen.append((cfg.mock, resolved["mock"])),
                        ["experiment=tiny", f"observation={tmp_path / 'obs'}", f"run_dir={tmp_path / 'run'}"])
    assert code == 0 and seen == [(str(tmp_path / "obs"), str(tmp_path / "obs"))]
    run = tmp_path / "two"
    assert main_wrapper("probe", lambda *a: None, ["experiment=tiny", "observation=/a", "mock=/b", f"run_dir={run}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fli-probe: error: observation= and mock=") and not run.exists()


@pytest.mark.parametrize("command", ["mock", "map", "sample", "nuts", "diagnose", "pipeline"])
def test_each_commands_help_says_what_it_needs_writes_and_shows_an_example(command):
    """--help prints the command's module docstring first (the test above): it names the keys a
    run needs, what it writes and one command line to copy."""
    import importlib

    doc = importlib.import_module(f"fli.cli.{command}").__doc__
    assert doc.startswith(f"``fli-{command}``:"), doc[:80]
    assert "Example:" in doc and f"``fli-{command} " in doc.split("Example:")[1], doc
    assert "writ" in doc.lower(), doc  # what it writes
    assert ("required" in doc) or ("Nothing is" in doc) or ("runs=" in doc), doc  # what it needs
