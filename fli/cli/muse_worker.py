"""``fli-muse-worker <run_dir> <k>``: worker ``k`` of a MUSE run whose workers meet through files.

Start fli-map with ``inference.map.estimator=muse inference.map.muse.spread=files
inference.map.muse.workers=P`` (it is worker 0), then ``fli-muse-worker <its run_dir> <k>`` for
k = 1..P-1, anywhere that reads and writes the run directory: as a SLURM job array, or as
background processes on one machine. Each worker fits its share of the simulations and appends
them to its own score file; fli-map writes the estimate. See :mod:`fli.infer.muse.worker`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fli.config import ConfigError

PROG = "fli-muse-worker"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=(
        "Worker k of a fli-map MUSE run whose workers meet through files: start fli-map with "
        "inference.map.estimator=muse inference.map.muse.spread=files inference.map.muse.workers=P (worker 0), "
        "then this command for k = 1..P-1 wherever the run directory is shared."))
    parser.add_argument("run_dir", help="the fli-map run directory (inference.map.muse.spread=files)")
    parser.add_argument("worker", type=int, help="this worker's number, 1 to inference.map.muse.workers - 1")
    parser.add_argument("--mock", help="the observation's path on this machine, where it differs from the run's "
                                       "(it must hold the same observation)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds to wait for fli-map's config and preconditioner (default: no limit)")
    args = parser.parse_args(argv)

    from fli.cli.common import setup_logging  # noqa: PLC0415
    from fli.infer.muse.worker import run_worker  # noqa: PLC0415

    log = setup_logging()
    try:
        run_worker(Path(args.run_dir), args.worker, log, mock=args.mock, timeout=args.timeout, setup=_setup)
    except (ConfigError, FileNotFoundError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    return 0


def _setup(cfg) -> None:
    """The run's devices and JAX settings in this one process (no jax.distributed)."""
    import jax  # noqa: PLC0415

    from fli.cli.common import setup_jax  # noqa: PLC0415

    if cfg.distributed.local_device_count:
        jax.config.update("jax_num_cpu_devices", int(cfg.distributed.local_device_count))
    setup_jax(cfg)


if __name__ == "__main__":
    raise SystemExit(main())
