"""A run directory's lock (fli.store.claim.RunDirLock): one command at a time, a live holder named
in the refusal, a dead one taken over. Holders here are real processes (``sleep``), killed with
SIGKILL as a crashed command would be; the commands' own use of it is tested end to end in
tests/infer/sample/test_nuts_resume.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from fli.store import claim as C


def _holder(tmp_path, proc, host=None, command="fli-sample"):
    rec = {"command": command, "host": host or socket.gethostname(), "process": C.process_id(proc.pid),
           "pid": proc.pid, "started": "2026-12-07 12:00:00"}
    (tmp_path / C.RunDirLock.NAME).write_text(json.dumps(rec))
    return rec


@pytest.fixture
def sleeper():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p
    p.kill()
    p.wait()


def test_the_lock_is_held_while_the_command_runs_and_gone_after(tmp_path):
    lock = C.RunDirLock(tmp_path / "run", "fli-map")
    assert lock.acquire() is None and lock.took_over is None
    rec = json.loads(lock.path.read_text())
    assert rec["command"] == "fli-map" and rec["pid"] == os.getpid() and rec["host"] == socket.gethostname()
    lock.release()
    assert not lock.path.exists()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process table from /proc")
def test_a_live_holder_is_refused_in_one_line_naming_it(tmp_path, sleeper):
    _holder(tmp_path, sleeper)
    why = C.RunDirLock(tmp_path, "fli-sample").acquire()
    assert why is not None and "\n" not in why
    assert f"pid {sleeper.pid}" in why and "fli-sample" in why and str(tmp_path) in why
    assert json.loads((tmp_path / C.RunDirLock.NAME).read_text())["pid"] == sleeper.pid  # left as it was


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process table from /proc")
def test_a_killed_holder_is_taken_over(tmp_path, sleeper):
    held = _holder(tmp_path, sleeper)
    sleeper.send_signal(signal.SIGKILL)
    sleeper.wait()
    lock = C.RunDirLock(tmp_path, "fli-sample")
    assert lock.acquire() is None
    assert lock.took_over == held and json.loads(lock.path.read_text())["pid"] == os.getpid()
    lock.release()


def test_another_hosts_holder_counts_while_its_heartbeat_is_fresh(tmp_path, sleeper):
    _holder(tmp_path, sleeper, host="elsewhere")
    assert "on elsewhere" in C.RunDirLock(tmp_path, "fli-map").acquire()
    old = time.time() - C.STALE_S - 5  # its node died: no heartbeat since
    os.utime(tmp_path / C.RunDirLock.NAME, (old, old))
    lock = C.RunDirLock(tmp_path, "fli-map")
    assert lock.acquire() is None and lock.took_over["host"] == "elsewhere"
    lock.release()


def test_a_release_leaves_a_lock_that_another_process_took_over(tmp_path, sleeper):
    lock = C.RunDirLock(tmp_path, "fli-map")
    assert lock.acquire() is None
    _holder(tmp_path, sleeper)  # (as if our heartbeat had gone stale and another host took it)
    lock.release()
    assert json.loads(lock.path.read_text())["pid"] == sleeper.pid


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process table from /proc")
def test_a_claim_names_its_process_so_that_a_reused_pid_does_not_pass_for_it(tmp_path, sleeper):
    ident = C.process_id(sleeper.pid)
    assert C.holds(ident, time.time())
    pid, boot, start = ident.split()
    assert not C.holds(f"{pid} {boot} {int(start) + 1}", time.time())  # same pid, another start
    assert C.claim(tmp_path / "c") and C.claim(tmp_path / "c")  # ours, and ours again
