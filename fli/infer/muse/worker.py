"""A MUSE worker that meets fli-map through files alone (``inference.map.muse.spread=files``).

``fli-map ... inference.map.estimator=muse inference.map.muse.spread=files
inference.map.muse.workers=P`` is worker 0: it fits the joint MAP, stores the fits'
preconditioner and fits the data and its share of the simulations. ``fli-muse-worker <run_dir> <k>``
(:func:`run_worker`) is worker ``k`` of ``1..P-1``: it reads the run's own ``config.yaml``,
waits for the preconditioner, then fits simulation ``i`` wherever ``(i + 1) % P == k``
(:class:`fli.infer.muse.estimator.Muse`), appends each fit to ``muse_scores.p<k>.jsonl`` and reads the
others' files to take the same Newton steps as worker 0. It writes nothing else: map.json, the
figures and the data's field are worker 0's.

No jax.distributed between them: a SLURM job array, processes on a machine whose sandbox has no
sockets, or machines that share only a file system. A worker stopped part-way is started again
with the same command and repeats only the fit it was making; the others wait for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from fli.config import ConfigError
from fli.store.manifest import MANIFEST, check_same_observation, read_manifest

POLL = (1.0, 30.0)  # [s] between looks for what worker 0 writes first: the first, and at most


def _wait_for(path: Path, what: str, log: logging.Logger, timeout: float | None) -> None:
    """Return once ``path`` exists; log every few minutes while waiting."""
    t0 = last = time.monotonic()
    pause = POLL[0]
    while not path.exists():
        now = time.monotonic()
        if timeout is not None and now - t0 > timeout:
            raise ConfigError(f"{path} did not appear within {timeout:.0f} s: {what}")
        if now - last > 120:
            last = now
            log.info("MUSE worker: waiting %.0f s for %s (%s)", now - t0, path, what)
        time.sleep(pause)
        pause = min(1.5 * pause, POLL[1])


def run_worker(run_dir: Path, worker: int, log: logging.Logger, mock: str | None = None,
               timeout: float | None = None, setup: Callable | None = None):
    """Worker ``worker`` of the MUSE run in ``run_dir`` (see the module docstring); returns
    its :class:`~fli.infer.muse.result.MuseResult`, the one worker 0 reaches from the same
    fits. ``mock``: the observation's path where it differs from the run's (on another
    machine); it must hold the same observation (compared by fingerprint). ``timeout``: seconds
    to wait for worker 0's config and preconditioner (None: as long as it takes). ``setup``:
    called with the run's config before any device is used (the command's devices and JAX
    settings)."""
    from fli.config import to_config  # noqa: PLC0415
    from fli.infer.posterior.setup import prepare  # noqa: PLC0415
    from fli.infer.muse.estimator import Muse  # noqa: PLC0415
    from fli.infer.muse.run import PRECONDITIONER, JsonlStore, stored_preconditioner  # noqa: PLC0415
    from fli.store.io import COMPLETE  # noqa: PLC0415

    run_dir = Path(run_dir)
    # a worker may start before fli-map has made the directory (a job array), not before its parent
    if run_dir.exists() and not run_dir.is_dir() or not run_dir.parent.is_dir():
        raise ConfigError(f"run_dir {run_dir} is not a directory and cannot become one: give the run directory of "
                          f"the fli-map run started with inference.map.muse.spread=files")
    # fli-map writes config.yaml, then its manifest (fli-run.json): both are there once the second is
    _wait_for(run_dir / MANIFEST, "fli-map writes it and config.yaml as it starts", log, timeout)
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    if mock is not None:
        resolved["mock"] = str(mock)
    cfg = to_config(resolved)
    if setup is not None:
        setup(cfg)
    settings = cfg.inference.map.muse
    if cfg.inference.map.estimator != "muse" or settings.spread != "files":
        raise ConfigError(f"run_dir {run_dir} is not a MUSE run whose workers meet through files (it has "
                          f"inference.map.estimator={cfg.inference.map.estimator}, inference.map.muse.spread="
                          f"{settings.spread}): start fli-map with inference.map.estimator=muse "
                          f"inference.map.muse.spread=files inference.map.muse.workers=<P>")
    if not 1 <= worker < settings.workers:
        raise ConfigError(f"worker {worker}: this run has inference.map.muse.workers={settings.workers}, so its "
                          f"workers are 1 to {settings.workers - 1} (fli-map itself is worker 0)")
    obs, post, data = prepare(cfg, log, compare_truth=False)
    check_same_observation((read_manifest(run_dir) or {}).get("observation"), obs, f"run_dir {run_dir}")
    start = settings.start
    theta0 = np.zeros(post.prior.n) if start is None else np.asarray(start, np.float64)
    pre = None
    if settings.precondition_rank:
        path = run_dir / PRECONDITIONER
        _wait_for(path / COMPLETE, "fli-map builds the fits' preconditioner after its joint MAP", log, timeout)
        pre, why = stored_preconditioner(path, post, theta0, settings.precondition_rank)
        if pre is None:
            raise ConfigError(f"{path} {why}: it is not this run's; start fli-map (worker 0) on {run_dir} again")
        log.info("MUSE worker %d of %d: the fits' preconditioner read from %s", worker, settings.workers, path)
    store = JsonlStore(run_dir, worker, writes=True, log=log)
    store.waiting_hint = (f"; a worker that stopped is started again with `fli-muse-worker {run_dir} <k>`, "
                          f"and worker 0 is fli-map itself")
    if store.n_read:
        log.info("MUSE worker %d: %d fits already in %s", worker, store.n_read, run_dir)
    m = Muse(post, data, settings, cfg.inference.map, seed=cfg.seed, store=store, log=log, rank=worker,
             size=settings.workers, pre=pre)
    res = m.run(theta0)
    log.info("MUSE worker %d of %d: done after %d iterations, %d gradient evaluations of its own; fli-map (worker 0) "
             "writes the estimate", worker, settings.workers, len(res.history), res.grad_evals_here)
    return res
