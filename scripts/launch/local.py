#!/usr/bin/env python
"""Start N processes of one fli command on this machine, as srun or mpirun would on a cluster.

usage: scripts/launch/local.py -n 2 [--devices-per-process 2] [--grace 5] -- fli-nuts key=value ...

Each process gets the command plus ``distributed.coordinator=127.0.0.1:<free port>``,
``distributed.num_processes=N``, ``distributed.process_id=<rank>`` and, with
``--devices-per-process``, ``distributed.local_device_count=<d>`` (CPU devices). Their stdout and
stderr come out line by line prefixed with ``[<rank>]``. The exit status is 0 when every process
exits 0; when one fails (non-zero status or a signal) the others get SIGTERM, then SIGKILL after
``--grace`` seconds, the launcher names the rank and its status, and exits with that status
(128 + signal number for a signal). Standard library only: it runs without the package installed.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

PROG = "launch_local"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the coordinator binds it a moment later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_argv(command: list[str], rank: int, n: int, coordinator: str, devices: int | None) -> list[str]:
    """The command line of process ``rank``: the user's command and the distributed overrides."""
    extra = [f"distributed.coordinator={coordinator}", f"distributed.num_processes={n}",
             f"distributed.process_id={rank}"]
    if devices is not None:
        extra.append(f"distributed.local_device_count={devices}")
    return [*command, *extra]


def status_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _pump(stream, rank: int, out, lock: threading.Lock) -> None:
    """Copy one process's output to ours, a line at a time, each line prefixed with its rank."""
    prefix = f"[{rank}] ".encode()
    for line in iter(stream.readline, b""):
        with lock:
            out.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
            out.flush()
    stream.close()


def _signal_all(procs: list[subprocess.Popen], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)  # the process and whatever it started
            except ProcessLookupError:
                pass


def stop(procs: list[subprocess.Popen], grace: float) -> None:
    """SIGTERM every live process, SIGKILL what is left after ``grace`` seconds."""
    _signal_all(procs, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    _signal_all(procs, signal.SIGKILL)
    for p in procs:
        p.wait()


def launch(command: list[str], n: int, devices: int | None = None, grace: float = 5.0,
           host: str = "127.0.0.1", port: int | None = None) -> int:
    """Run ``command`` as ``n`` processes of one jax.distributed job; return the exit status."""
    coordinator = f"{host}:{port or free_port(host)}"
    out = sys.stdout.buffer
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    pumps = []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    print(f"{PROG}: {n} process(es), coordinator {coordinator}: {' '.join(command)}", file=sys.stderr, flush=True)
    for rank in range(n):
        p = subprocess.Popen(rank_argv(command, rank, n, coordinator, devices), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, env=env, start_new_session=True)
        procs.append(p)
        t = threading.Thread(target=_pump, args=(p.stdout, rank, out, lock), daemon=True)
        t.start()
        pumps.append(t)

    def forward(signum, _frame):  # Ctrl-C or scancel on the launcher: stop the job, not just us
        print(f"{PROG}: {signal.Signals(signum).name}: stopping every process", file=sys.stderr, flush=True)
        stop(procs, grace)
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    failed: tuple[int, int] | None = None
    try:
        while failed is None and any(p.poll() is None for p in procs):
            for rank, p in enumerate(procs):
                code = p.poll()
                if code not in (None, 0):
                    failed = (rank, code)
                    break
            time.sleep(0.05)
        if failed is None:  # all exited: the last poll may have caught a failure
            failed = next(((r, p.returncode) for r, p in enumerate(procs) if p.returncode), None)
        if failed is not None:
            rank, code = failed
            live = [r for r, p in enumerate(procs) if p.poll() is None]
            what = f"; stopping rank(s) {', '.join(map(str, live))}" if live else ""
            print(f"{PROG}: rank {rank} failed ({status_text(code)}){what}", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            stop(procs, grace)
            if live:
                print(f"{PROG}: all processes stopped {time.monotonic() - t0:.1f} s later", file=sys.stderr,
                      flush=True)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for t in pumps:
            t.join(timeout=2.0)
    if failed is None:
        return 0
    code = failed[1]
    return 128 - code if code < 0 else code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        i = argv.index("--")
        own, command = argv[:i], argv[i + 1:]
    else:
        own, command = argv, []
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                 usage="%(prog)s -n N [--devices-per-process D] [--grace S] -- COMMAND ...")
    ap.add_argument("-n", "--nproc", type=int, required=True, help="number of processes")
    ap.add_argument("--devices-per-process", type=int, default=None,
                    help="CPU devices per process (distributed.local_device_count); default: leave unset")
    ap.add_argument("--grace", type=float, default=5.0,
                    help="seconds between SIGTERM and SIGKILL when stopping the others (default 5)")
    ap.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
    args = ap.parse_args(own)
    if not command:
        ap.error("no command: give it after --, e.g. -- fli-nuts mock=DIR")
    if args.nproc < 1:
        ap.error(f"-n must be at least 1, got {args.nproc}")
    if args.devices_per_process is not None and args.devices_per_process < 1:
        ap.error(f"--devices-per-process must be at least 1, got {args.devices_per_process}")
    return launch(command, args.nproc, args.devices_per_process, args.grace, port=args.port)


if __name__ == "__main__":
    raise SystemExit(main())
