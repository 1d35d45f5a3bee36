"""fli-nuts on several processes: scripts/launch/local.py, mpirun, srun; a process that dies.

The chain (SMALL posterior, float64, 3 warm-up + 3 draws in chunks of 3, tree depth <= 3,
every draw's field kept) runs as 1 process x 4 devices and as 2 processes x 2 devices (pdims
[2, 2] both); tree depths must be equal and positions agree to 1e-8. One U-turn decided
differently would change a tree depth and separate the chains for good, so this tests that
the multi-process program computes what the one-process program does. The program is the same
whichever launcher starts the processes, so the chain runs under none (2 bare processes given
explicit overrides), and that same run then loses a process, to show that its peer stops. What
differs between launchers is how fli's start-up finds its peers (explicit overrides, Open MPI's
or SLURM's variables), and that runs under every launcher with fli's start-up and a body of
milliseconds (tests/helpers/hydra_probe.py): 2 processes, 4 devices, one run directory.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from fli.infer.sample.run_store import complete_chunks, read_chunks
from tests.helpers.posterior import SMALL
from tests.helpers.processes import ROOT, child_env, free_port

LAUNCH = [sys.executable, str(ROOT / "scripts" / "launch" / "local.py")]
NUTS = [sys.executable, "-m", "fli.cli.nuts"]
CHAIN = ["inference.num_warmup=3", "inference.num_samples=3", "inference.chunk=3", "inference.field_thin=1",
         "inference.max_tree_depth=3", "seed=3", "simulation.dtype=float64", "progress=false",
         "distributed.pdims=[2,2]"]
# float64 throughout: the same program on another layout or over gloo differs only in the
# order of its sums (~1e-16 relative per operation); 1e-8 leaves room for 6 draws of leapfrog
# amplification and still catches any U-turn decided differently (that moves positions O(0.1))
TOL = 1e-8


def _env(**extra) -> dict:
    env = child_env(PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


# --------------------------------------------------------------------------- the launcher itself


def _launch_py(code: str, n: int, timeout: float = 60):
    t0 = time.monotonic()
    r = subprocess.run([*LAUNCH, "-n", str(n), "--grace", "2", "--", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=timeout, env=_env())
    return r, time.monotonic() - t0


# each process reads its rank from the override the launcher appends (distributed.process_id=<r>)
_RANK = "import os, sys, time; r = int([a for a in sys.argv if 'process_id' in a][0].split('=')[1]); "


@pytest.mark.multiprocess
def test_launcher_prefixes_output_and_passes_the_distributed_overrides():
    r, _ = _launch_py(_RANK + "print('hello', sys.argv[1:])", n=2)
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith(f"[{rank}] hello"))
        assert f"distributed.process_id={rank}" in line and "distributed.num_processes=2" in line
        assert "distributed.coordinator=127.0.0.1:" in line


@pytest.mark.multiprocess
@pytest.mark.parametrize("how, status, text", [
    ("sys.exit(3)", 3, "rank 1 failed (exit code 3)"),
    ("os.kill(os.getpid(), 9)", 128 + 9, "rank 1 failed (killed by SIGKILL)"),
])
def test_launcher_stops_the_others_when_one_rank_fails(how, status, text):
    """Rank 1 fails after 1 s while ranks 0 and 2 would sleep 120 s (and rank 2 ignores SIGTERM):
    the launcher exits with rank 1's status, names it, and is done within grace (2 s) + polling."""
    code = _RANK + ("import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN) if r == 2 else None; "
                    f"time.sleep(1); {how} if r == 1 else time.sleep(120)")
    r, dt = _launch_py(code, n=3)
    assert r.returncode == status, (r.returncode, r.stderr)
    assert text in r.stderr and "stopping rank(s) 0, 2" in r.stderr, r.stderr
    assert dt < 10, dt  # measured ~3.5 s: 1 s to fail, 2 s grace for the rank that ignores SIGTERM


# --------------------------------------------------------------------------- shared set-up


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("jaxcache")


@pytest.fixture(scope="module")
def one_process(small_mock, cache, tmp_path_factory):
    """The reference: 1 process x 4 CPU devices, pdims [2, 2]."""
    run = tmp_path_factory.mktemp("nuts") / "one"
    r = subprocess.run([*NUTS, *SMALL, *CHAIN, f"mock={small_mock}", f"run_dir={run}", f"compilation_cache={cache}",
                        "distributed.local_device_count=4"], capture_output=True, text=True, cwd=ROOT,
                       env=_env(), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return run


def _fields(run: Path, chunks: list[int]) -> dict[str, np.ndarray]:
    import zarr

    out = {}
    for i in chunks:
        g = zarr.open_group(str(run / "chunks" / f"chunk_{i:05d}" / "fields.zarr"), mode="r")
        for name in ("white_noise", "kappa"):
            out.setdefault(name, []).append(np.asarray(g[name][...]))
    return {k: np.concatenate(v) for k, v in out.items()}


def compare_chains(ref: Path, other: Path) -> dict[str, float]:
    """Assert equal tree depths and positions within TOL over the reference's chunks 0 and 1
    (``other`` may hold more); return max |diff| per quantity."""
    chunks = [0, 1]
    assert complete_chunks(ref) == chunks and complete_chunks(other)[:2] == chunks
    a, b = read_chunks(ref, chunks), read_chunks(other, chunks)
    np.testing.assert_array_equal(b["stats"]["tree_depth"], a["stats"]["tree_depth"], err_msg="tree_depth")
    np.testing.assert_array_equal(b["stats"]["n_steps"], a["stats"]["n_steps"], err_msg="n_steps")
    diffs = {}
    for name in ("Omega_c", "sigma8"):
        diffs[name] = float(np.max(np.abs(b["draws"][name] - a["draws"][name])))
    fa, fb = _fields(ref, chunks), _fields(other, chunks)
    assert fa["white_noise"].shape == fb["white_noise"].shape == (6, 8, 8, 32)
    for name in fa:
        diffs[name] = float(np.max(np.abs(fb[name] - fa[name])))
    print(f"max |diff| vs 1 process x 4 devices: {diffs}")
    for name in ("Omega_c", "sigma8", "white_noise"):
        assert diffs[name] <= TOL, (name, diffs)
    return diffs


# --------------------------------------------------------------------------- SLURM on this machine


def _sinfo_up(env: dict) -> bool:
    try:
        r = subprocess.run(["sinfo", "-h", "-o", "%a"], capture_output=True, text=True, timeout=10, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "up" in r.stdout


def _munge_ok() -> bool:
    try:
        enc = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
        dec = subprocess.run(["unmunge"], input=enc.stdout, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return enc.returncode == 0 and dec.returncode == 0


_SLURM_CONF = """ClusterName=fli-test
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SlurmUser=root
ReturnToService=2
MpiDefault=none
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def slurm():
    """The environment for ``srun``: a SLURM cluster that answers, else a one-node cluster
    started here (slurmctld + slurmd on this host, munge; needs root and Debian's slurm-wlm and
    munge), stopped afterwards. Skips, saying why, where neither is possible."""
    if shutil.which("srun") is None or shutil.which("slurmctld") is None:
        pytest.skip("SLURM is not installed (Debian: apt-get install slurm-wlm munge)")
    env = _env()
    if _sinfo_up(env):
        yield env
        return
    if os.geteuid() != 0:
        pytest.skip("no SLURM cluster answers sinfo, and starting a local one needs root")
    started: list[Path] = []
    if not _munge_ok():
        if not Path("/etc/munge/munge.key").is_file() or shutil.which("munged") is None:
            pytest.skip("munge is not installed or has no key (/etc/munge/munge.key)")
        os.makedirs("/run/munge", exist_ok=True)
        subprocess.run(["chown", "-R", "munge:munge", "/run/munge", "/var/lib/munge", "/var/log/munge"],
                       capture_output=True)
        subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], capture_output=True, timeout=30)
        time.sleep(1)
        if not _munge_ok():
            pytest.skip("munged could not be started, so SLURM cannot authenticate")
        started.append(Path("/run/munge/munged.pid"))
    d = Path(tempfile.mkdtemp(prefix="fli-slurm-"))
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    host = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text(_SLURM_CONF.format(host=host, ctld_port=_port(), d_port=_port(), d=d, cpus=os.cpu_count()))
    env["SLURM_CONF"] = str(conf)
    for daemon, pid in (("slurmctld", "slurmctld.pid"), ("slurmd", "slurmd.pid")):
        r = subprocess.run([daemon, "-f", str(conf)], capture_output=True, text=True, timeout=60, env=env)
        if r.returncode != 0:
            _stop_daemons([d / "slurmd.pid", d / "slurmctld.pid", *started])
            pytest.skip(f"{daemon} did not start: {r.stderr.strip()[-300:]}")
        started.insert(0, d / pid)
    t0 = time.monotonic()
    while not _sinfo_up(env) and time.monotonic() - t0 < 30:
        time.sleep(0.5)
    if not _sinfo_up(env):
        _stop_daemons(started)
        pytest.skip(f"the local SLURM cluster did not come up in 30 s (logs in {d})")
    yield env
    _stop_daemons(started, env)
    shutil.rmtree(d, ignore_errors=True)


def _stop_daemons(pidfiles: list[Path], env: dict | None = None) -> None:
    """SIGTERM the daemons this fixture started, by the ids in their pid files, one after the
    other (slurmd, slurmctld, munged), once the cluster has no job left (so that no step
    daemon is left waiting for a slurmd that is gone)."""
    t0 = time.monotonic()
    while env is not None and time.monotonic() - t0 < 15:
        r = subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=env, timeout=10)
        if r.returncode or not r.stdout.strip():
            break
        time.sleep(0.5)
    for f in pidfiles:
        try:
            pid = int(f.read_text().split()[0])
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            continue
        t1 = time.monotonic()
        while Path(f"/proc/{pid}").exists() and time.monotonic() - t1 < 10:
            time.sleep(0.1)


# --------------------------------------------------------------------------- the same chain everywhere


def _mpirun_env() -> dict:
    # Open MPI as root, more ranks than cores; no inherited SLURM/OMPI job variables
    env = {k: v for k, v in _env().items() if not k.startswith(("SLURM_", "OMPI_", "PMI"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    return env


def _two_process_argv(launcher: str, command: list[str], args: list[str]) -> list[str]:
    if launcher == "launch_local":
        return [*LAUNCH, "-n", "2", "--devices-per-process", "2", "--", *command, *args]
    dev = ["distributed.local_device_count=2"]
    if launcher == "mpirun":
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "2", *command, *args, *dev]
    return ["srun", "-n", "2", "-N", "1", "--overlap", "--kill-on-bad-exit=1", *command, *args, *dev]


def _launcher_env(launcher: str, request) -> dict:
    if launcher == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("Open MPI's mpirun is not installed (Debian: openmpi-bin)")
    return request.getfixturevalue("slurm") if launcher == "srun" else (
        _mpirun_env() if launcher == "mpirun" else _env())


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["launch_local", "mpirun", "srun"])
def test_every_launcher_starts_two_processes_on_one_run_directory(launcher, tmp_path, request):
    """fli's start-up (the same main_wrapper as fli-nuts) under ``launcher``, with no
    coordinator given where the launcher has its own variables: both processes join one
    jax.distributed run of 2 processes and 4 devices, and agree on one timestamped run
    directory (process 0's) without run_dir."""
    env = _launcher_env(launcher, request)
    argv = _two_process_argv(launcher, [sys.executable, "-m", "tests.helpers.hydra_probe"],
                             ["distributed.pdims=[2,2]"])
    r = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert "2 process(es), 4 device(s)" in r.stdout + r.stderr
    [run] = list((tmp_path / "outputs" / "probe").iterdir())
    recs = [json.loads(p.read_text()) for p in sorted(run.glob("probe.*.json"))]
    assert [p.name for p in sorted(run.glob("probe.*.json"))] == ["probe.0.json", "probe.1.json"]
    assert {r["processes"] for r in recs} == {2} and len({r["pid"] for r in recs}) == 2, recs


# --------------------------------------------------------------------------- the chain, and a process that dies


# 285 s in the fresh-clone CI of 469bd9a, the small mock and the 1 x 4 reference included (530 s alone once)
@pytest.mark.slow(seconds=285)
@pytest.mark.multiprocess
def test_two_processes_reproduce_the_one_process_chain_and_stop_when_one_dies(small_mock, one_process, cache,
                                                                               tmp_path):
    """2 fli-nuts processes x 2 devices with no launcher watching (as under a bare mpirun or srun),
    asked for 300 draws, share one run (each half used to start its own pair of processes):

    - their chunks 0 and 1 (3 warm-up draws and 3 draws) equal the 1 process x 4 devices
      reference draw for draw (the chunk program does not depend on the number of draws asked);
    - then rank 1 is SIGKILLed, and rank 0 must exit non-zero within the heartbeat timeout (10 s
      here) plus a margin, saying that a task died. Measured: 9.1 s (SIGABRT)."""
    heartbeat = 10
    run, port = tmp_path / "run", free_port()
    args = [*NUTS, *SMALL, *CHAIN, "inference.num_samples=300", f"mock={small_mock}", f"run_dir={run}",
            f"compilation_cache={cache}", f"distributed.coordinator=127.0.0.1:{port}",
            "distributed.num_processes=2", "distributed.local_device_count=2"]
    env = _env(FLI_HEARTBEAT_TIMEOUT=str(heartbeat))
    logs = [open(tmp_path / f"rank{i}.log", "w+") for i in range(2)]

    def tails() -> str:
        return "\n".join(f"--- rank {i}:\n{(tmp_path / f'rank{i}.log').read_text()[-2000:]}" for i in range(2))

    procs = [subprocess.Popen([*args, f"distributed.process_id={i}"], cwd=ROOT, env=env, stdout=logs[i],
                              stderr=subprocess.STDOUT) for i in range(2)]
    try:
        t0 = time.monotonic()
        while (len(complete_chunks(run)) < 2 and time.monotonic() - t0 < 900
               and all(p.poll() is None for p in procs)):
            time.sleep(0.05)
        assert all(p.poll() is None for p in procs) and len(complete_chunks(run)) >= 2, \
            f"2 chunks not written by 2 live processes: {tails()}"
        procs[1].send_signal(signal.SIGKILL)
        t_kill = time.monotonic()
        try:
            code = procs[0].wait(timeout=heartbeat + 60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"rank 0 still running {heartbeat + 60} s after rank 1 was killed")
        dt = time.monotonic() - t_kill
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for f in logs:
        f.close()
    out = (tmp_path / "rank0.log").read_text()
    assert "2 process(es), 4 device(s)" in out, tails()
    compare_chains(one_process, run)
    print(f"rank 0 exited with status {code} {dt:.1f} s after rank 1 was killed")
    assert code != 0
    assert dt < heartbeat + 20, dt
    assert "Task 1 heartbeat timeout" in out or "another task died" in out, out[-3000:]
    assert len(complete_chunks(run)) < 101  # it did stop: 300 draws in chunks of 3 would be 101 chunks
