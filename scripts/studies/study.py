"""What the long studies' drivers share: a command run niced on one core, and a mock claimed by
one of several drivers (scripts/studies/muse_calibration.py, scripts/studies/model_error.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_logged(cmd: list[str], log: Path, core: int | str = 0, ok: tuple[int, ...] = (0,),
               every: tuple[float, Callable[[], None]] | None = None) -> int:
    """``python -m cmd...`` under ``nice -n 19``, pinned to ``core`` and single-threaded, its
    output appended to ``log``; its exit status. Any status outside ``ok`` stops the driver in one
    line naming the log. ``every=(seconds, f)`` calls ``f`` that often while the command runs, and
    once when it ends (a study saving its progress somewhere that outlives the machine). A driver
    stopped by SIGTERM or Ctrl-C stops the command first: an orphan left running would share its
    run directory with the command of the next driver to claim the mock."""
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    if "STUDY_JAX_PLATFORMS" in env:  # a driver kept off an accelerator (one process can hold a TPU) lends it here
        env["JAX_PLATFORMS"] = env.pop("STUDY_JAX_PLATFORMS")
    full = ["nice", "-n", "19", "taskset", "-c", str(core), sys.executable, "-m", *cmd]

    proc, pending = None, []

    def stop(signum, _frame):
        if proc is None:  # the command is still starting (fork to exec): stop it once it is there
            pending.append(signum)
            return
        raise SystemExit(f"stopped by signal {signum}")

    previous = signal.signal(signal.SIGTERM, stop)
    with open(log, "a") as f:
        try:
            proc = subprocess.Popen(full, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        except BaseException:
            signal.signal(signal.SIGTERM, previous)
            raise
        try:
            if pending:
                raise SystemExit(f"stopped by signal {pending[0]}")
            while True:
                try:
                    rc = proc.wait(timeout=every[0] if every else None)
                    break
                except subprocess.TimeoutExpired:
                    every[1]()
        finally:
            signal.signal(signal.SIGTERM, previous)
            if proc.poll() is None:  # the driver is stopping: so does its command (nice and taskset exec it)
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
            if every:  # also when stopped: the fits finished since the last copy are kept
                every[1]()
    if rc not in ok:
        raise SystemExit(f"{' '.join(cmd[:1])} failed with status {rc}; see {log}")
    return rc


def _process_id(pid: int) -> str:
    """``"<pid> <boot id> <start time>"``: a process named so that a later one given the same id
    (after a reboot, or once ids wrap) does not pass for it; ``""`` where ``pid`` does not run."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return f"{pid} {boot} {stat.rsplit(')', 1)[1].split()[19]}"  # field 22, after the command's name


def _started(pid: int) -> float | None:
    """The epoch second process ``pid`` started at (None where it does not run)."""
    try:
        btime = next(int(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines() if x.startswith("btime"))
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def _holds(text: str, written: float) -> bool:
    """Whether the process a claim file names still runs: the same id, boot and start time. A
    claim holding only an id (written before the start time was kept) counts while a process of
    that id runs that started before the claim was ``written`` (its mtime)."""
    parts = text.split()
    try:
        pid = int(parts[0]) if parts else 0
    except ValueError:
        return False
    if pid <= 0:
        return False
    if len(parts) == 1:
        start = _started(pid)
        return start is not None and start <= written + 1  # the clock ticks round the start down
    return _process_id(pid) == " ".join(parts)


def claim(out: Path, i: int | str) -> bool:
    """Take item ``i`` of the study in ``out`` for this process unless a live driver holds it
    (``claim_<i>`` names the holder by process id, boot and start time, :func:`_process_id`; a
    claim whose process is gone is taken over, even where a new process has its id: the claims
    outlive the machine's sessions, and a driver once skipped a mock because an unrelated process
    had the id of the dead driver that had claimed it).
    An int names a mock or a pair (``claim_007``), a string any finer item (``claim_007_model_all``)."""
    path = out / (f"claim_{i:03d}" if isinstance(i, int) else f"claim_{i}")
    me = _process_id(os.getpid())
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            holder, written = path.read_text(), path.stat().st_mtime
        except OSError:
            holder, written = "", 0.0
        if holder.split() == me.split() or holder.strip() == str(os.getpid()):
            return True
        if _holds(holder, written):
            return False
        path.write_text(me)  # the holder is gone: take it over
        return True
    with os.fdopen(fd, "w") as f:
        f.write(me)
    return True


def emit(res: dict, path: Path | None) -> None:
    """A study's summary as JSON on stdout and, with ``path`` (``--json``), in that file."""
    import json  # noqa: PLC0415

    text = json.dumps(res, indent=1)
    print(text)
    if path:
        Path(path).write_text(text + "\n")


def keep_record(src: Path, dst: Path) -> None:
    """Copy a finished analysis's ``src`` (map.json) to ``dst`` in a committed folder, renamed
    into place so that a record is never half-written."""
    import shutil  # noqa: PLC0415

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    tmp.rename(dst)
