"""What the long studies' drivers share: a command run niced on one core, and a mock claimed by
one of several drivers (scripts/studies/muse_calibration.py, scripts/studies/model_error.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from fli.store.claim import claim as claim_file

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


def claim(out: Path, i: int | str) -> bool:
    """Take item ``i`` of the study in ``out`` for this process unless a live driver holds it
    (``claim_<i>`` names the holder by process id, boot and start time, :func:`fli.store.claim.claim`; a
    claim whose process is gone is taken over, even where a new process has its id: the claims
    outlive the machine's sessions, and a driver once skipped a mock because an unrelated process
    had the id of the dead driver that had claimed it).
    An int names a mock or a pair (``claim_007``), a string any finer item (``claim_007_model_all``)."""
    return claim_file(out / (f"claim_{i:03d}" if isinstance(i, int) else f"claim_{i}"))


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
