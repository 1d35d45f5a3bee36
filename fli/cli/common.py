"""Shared start-up of every console script.

``fli-<cmd> [hydra overrides...]`` composes ``conf/config.yaml`` with Hydra's compose API,
validates it into :class:`fli.config.Config` *before* anything is written or compiled,
initialises ``jax.distributed`` when launched by srun/mpirun (or told to), and creates one run
directory, the same on every process. Bad input exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from omegaconf import OmegaConf

from fli.config import Config, ConfigError, register_configs

USAGE = """usage: {prog} [--cfg] [--help] [key=value ...] [group=option ...]

Hydra overrides, e.g.  simulation.mesh=[32,32,64]  distributed.pdims=[1,2]  experiment=tiny
--cfg   print the composed, validated config and exit
config groups (conf/): {groups}
"""


def conf_dir() -> Path:
    """The ``conf/`` tree: ``$FLI_CONF_DIR``, else the one beside the installed package."""
    env = os.environ.get("FLI_CONF_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "conf"
    if not (path / "config.yaml").is_file():
        raise ConfigError(f"config tree not found: {path}/config.yaml (set FLI_CONF_DIR to the conf/ folder)")
    return path


def compose(overrides: list[str]) -> tuple[Config, dict]:
    """Compose and validate; returns the typed config and the resolved plain dict."""
    from hydra import compose as hcompose  # noqa: PLC0415
    from hydra import initialize_config_dir  # noqa: PLC0415
    from hydra.core.global_hydra import GlobalHydra  # noqa: PLC0415
    from hydra.errors import HydraException  # noqa: PLC0415
    from omegaconf.errors import OmegaConfBaseException  # noqa: PLC0415

    from fli.config import to_config  # noqa: PLC0415

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            dcfg = hcompose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_one_line(e)) from None
    cfg = to_config(dcfg)
    return cfg, OmegaConf.to_container(dcfg, resolve=True)


def _one_line(e: BaseException) -> str:
    msg = str(e).strip()
    cause = e.__cause__ or e.__context__
    if cause is not None and str(cause).strip():
        msg = str(cause).strip()
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("full_key", "object_type", "reference_type"))]
    full_key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key")), "")
    head = keep[0] if keep else type(e).__name__
    return f"{full_key}: {head}" if full_key and full_key not in head else head


def setup_logging() -> logging.Logger:
    from fli.sharding import get_logger  # noqa: PLC0415

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU" chatter
    return get_logger("fli")


def run_directory(cfg: Config, command: str) -> Path:
    """The run directory, the same on every process (process 0's clock is broadcast)."""
    if cfg.run_dir:
        return Path(cfg.run_dir)
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    now = _dt.datetime.now()
    # two int32 values (date, time in ms): int64 would be narrowed without jax_enable_x64
    stamp = np.array([int(now.strftime("%Y%m%d")), int(now.strftime("%H%M%S")) * 1000 + now.microsecond // 1000],
                     dtype=np.int32)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils  # noqa: PLC0415

        stamp = np.asarray(multihost_utils.broadcast_one_to_all(stamp))
    d, t = f"{int(stamp[0]):08d}", f"{int(stamp[1]):09d}"
    return Path("outputs") / command / f"{d[:4]}-{d[4:6]}-{d[6:]}_{t[:2]}-{t[2:4]}-{t[4:6]}-{t[6:]}"


def main_wrapper(command: str, body: Callable[[Config, dict, Path, logging.Logger], None],
                 argv: list[str] | None = None) -> int:
    """Parse argv, validate, set up devices and the run directory, run ``body``; return exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = f"fli-{command}"
    if "-h" in argv or "--help" in argv:
        groups = ", ".join(sorted(p.name for p in conf_dir().iterdir() if p.is_dir()))
        print(USAGE.format(prog=prog, groups=groups))
        return 0
    show = "--cfg" in argv
    argv = [a for a in argv if a != "--cfg"]
    bad = [a for a in argv if a.startswith("-")]
    try:
        if bad:
            raise ConfigError(f"unknown option {bad[0]}: give Hydra overrides key=value (see --help)")
        cfg, resolved = compose(argv)
        if show:
            print(OmegaConf.to_yaml(resolved))
            return 0
        log = setup_logging()
        from fli.sharding import init_distributed, n_devices_needed  # noqa: PLC0415

        d = cfg.distributed
        init_distributed(d.coordinator, d.num_processes, d.process_id, d.local_device_count)
        import jax  # noqa: PLC0415

        if cfg.compilation_cache:
            # a repeated command (a resume, another seed) skips recompiling the same program
            jax.config.update("jax_compilation_cache_dir", str(Path(cfg.compilation_cache).expanduser()))
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.0)
        need, have = n_devices_needed(d.pdims), jax.device_count()
        if need > have:
            raise ConfigError(f"distributed.pdims {list(d.pdims)} needs {need} devices, found {have} "
                              f"(set distributed.local_device_count={need} on CPU)")
        run_dir = run_directory(cfg, command)
        log.info("%s: %d process(es), %d device(s) (%s), run directory %s", prog, jax.process_count(),
                 have, jax.devices()[0].platform, run_dir)
        body(cfg, resolved, run_dir, log)
    except ConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    return 0
