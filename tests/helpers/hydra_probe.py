"""A console script on fli's start-up (main_wrapper) whose body takes milliseconds, for the
Hydra CLI tests: it logs a progress line and writes ``probe.<process>.json`` into its run
directory; ``name=refuse`` makes the body refuse (a ConfigError) after Hydra made the directory,
``name=refuse_late`` after writing ``work.txt``."""

import json
import os
import sys

from fli.config import ConfigError


def body(cfg, resolved, run_dir, log):
    import jax

    if cfg.name == "refuse":
        raise ConfigError("name: refused on purpose")
    if cfg.name == "refuse_late":  # as fli-map's halo check at the MAP, after hours of work
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "work.txt").write_text("results")
        raise ConfigError("name: refused after writing")
    log.info("probe progress: seed %d", cfg.seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    rec = {"seed": cfg.seed, "run_dir": str(run_dir), "cwd": os.getcwd(), "processes": jax.process_count(),
           "pid": os.getpid()}
    (run_dir / f"probe.{jax.process_index()}.json").write_text(json.dumps(rec))


if __name__ == "__main__":
    import tests.helpers.hydra_probe as probe  # by reference, so that a launcher's job process can unpickle it
    from fli.cli.common import main_wrapper

    sys.exit(main_wrapper("probe", probe.body))
