"""Claims: a file that says which live process holds something (a run directory, a study's mock),
so that a second process refuses it while the first runs and takes it over once it is gone.

A claim names its holder as ``"<pid> <boot id> <start time>"`` on its host: a later process that
gets the same pid (after a reboot, or once pids wrap) does not pass for it. It is made with
``O_CREAT | O_EXCL``, so two processes racing for a free claim cannot both win. The holder's
liveness is read from /proc on its own host; a claim of another host (a cluster node sharing the
file system) counts while its holder keeps it fresh (:class:`RunDirLock`'s heartbeat touches it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

HEARTBEAT_S = 30.0  # a run directory's holder touches its lock this often
STALE_S = 600.0  # a lock of another host untouched this long is taken over


def process_id(pid: int) -> str:
    """``"<pid> <boot id> <start time>"`` of a running process on this host; ``""`` where ``pid``
    does not run (or /proc cannot tell)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return f"{pid} {boot} {stat.rsplit(')', 1)[1].split()[19]}"  # field 22, after the command's name


def started(pid: int) -> float | None:
    """The epoch second process ``pid`` started at (None where it does not run)."""
    try:
        btime = next(int(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines() if x.startswith("btime"))
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def holds(ident: str, written: float) -> bool:
    """Whether the process ``ident`` names (:func:`process_id`) still runs on this host. An id
    alone (an older claim's) counts while a process of that id runs that started before the claim
    was ``written`` (its mtime)."""
    parts = ident.split()
    try:
        pid = int(parts[0]) if parts else 0
    except ValueError:
        return False
    if pid <= 0:
        return False
    if len(parts) == 1:
        start = started(pid)
        return start is not None and start <= written + 1  # the clock ticks round the start down
    return process_id(pid) == " ".join(parts)


def claim(path: Path) -> bool:
    """Take the claim file ``path`` for this process unless a live process holds it; a claim whose
    process is gone is taken over, even where a new process has its pid."""
    me = process_id(os.getpid())
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        try:
            holder, written = path.read_text(), path.stat().st_mtime
        except OSError:
            holder, written = "", 0.0
        if holder.split() == me.split() or holder.strip() == str(os.getpid()):
            return True
        if holds(holder, written):
            return False
        path.write_text(me)  # the holder is gone: take it over
        return True
    with os.fdopen(fd, "w") as f:
        f.write(me)
    return True


class RunDirLock:
    """One command at a time in a run directory: ``run_dir/fli-run.lock`` names the holder (command,
    host, process, start time) while it runs and goes when it ends. A second command on the same
    directory refuses in one line naming the holder (:meth:`acquire` returns that line); a holder
    killed on this host is taken over at once, one on another host once its heartbeat is
    :data:`STALE_S` old. Used by the commands' process 0 (:mod:`fli.cli.common`)."""

    NAME = "fli-run.lock"

    def __init__(self, run_dir: Path, command: str):
        self.path = Path(run_dir) / self.NAME
        self.command = command
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.took_over: dict | None = None

    def _record(self) -> dict:
        return {"command": self.command, "host": socket.gethostname(), "process": process_id(os.getpid()),
                "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}

    def _live(self, rec: dict, mtime: float) -> bool:
        if rec.get("host") != socket.gethostname():
            return time.time() - mtime < STALE_S
        if rec.get("process"):
            return holds(rec["process"], mtime)
        try:  # a host without /proc: the pid alone
            os.kill(int(rec.get("pid")), 0)
        except (ProcessLookupError, TypeError, ValueError):
            return False
        except PermissionError:
            return True
        return True

    def acquire(self) -> str | None:
        """Take the lock; None when taken, else the one-line reason it is held."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mine = json.dumps(self._record())
        for _ in range(3):  # a holder that ends between our two looks: look again
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    text, mtime = self.path.read_text(), self.path.stat().st_mtime
                    rec = json.loads(text) if text.strip() else {}
                except FileNotFoundError:
                    continue
                except (OSError, ValueError):
                    rec, mtime = {}, 0.0  # unreadable: a writer killed mid-write, long ago or now
                if rec and self._live(rec, mtime):
                    return (f"run_dir {self.path.parent} is in use by {rec.get('command', 'a fli command')} "
                            f"(pid {rec.get('pid')} on {rec.get('host')}, since {rec.get('started')}): wait for "
                            f"it to end or choose another run_dir; {self.path} names the holder")
                tmp = self.path.with_name(f".{self.NAME}.{os.getpid()}")
                tmp.write_text(mine)
                os.replace(tmp, self.path)  # the holder is gone: take it over
                self.took_over = rec
                break
            with os.fdopen(fd, "w") as f:
                f.write(mine)
            break
        else:
            return f"run_dir {self.path.parent}: {self.path} keeps changing hands; try again"
        self._beat = threading.Thread(target=self._heartbeat, name="fli-run-lock", daemon=True)
        self._beat.start()
        return None

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                pass

    def release(self) -> None:
        """Give the lock back (only ours: a lock another process took over stays)."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        try:
            rec = json.loads(self.path.read_text())
            if rec.get("pid") == os.getpid() and rec.get("host") == socket.gethostname():
                self.path.unlink()
        except (OSError, ValueError):
            pass


@contextlib.contextmanager
def holding(run_dir: Path, command: str, log: logging.Logger):
    """Hold ``run_dir`` for ``command`` while the block runs: process 0 takes its :class:`RunDirLock`
    and every process refuses together (:class:`ConfigError`, one line naming the live holder);
    a dead holder's lock is taken over with a warning."""
    import jax  # noqa: PLC0415

    from fli.config import ConfigError  # noqa: PLC0415
    from fli.store.files import agree  # noqa: PLC0415

    lock = RunDirLock(run_dir, command) if jax.process_index() == 0 else None
    why = agree([lock.acquire() if lock is not None else None])[0]
    if why:
        raise ConfigError(why)
    if lock is not None and lock.took_over is not None:
        held = lock.took_over
        log.warning("run_dir %s: taken over from %s (pid %s on %s, since %s), which no longer runs", run_dir,
                    held.get("command", "an unreadable lock"), held.get("pid"), held.get("host"), held.get("started"))
    try:
        yield
    finally:
        if lock is not None:
            lock.release()
