"""The config of a command: Hydra's compose API on ``conf/``, validated into
:class:`fli.config.Config`, with bad input turned into one line that names the key and what would
be valid (a close match of a mistyped key, the options of a config group).

:func:`compose` is the whole of it for scripts and tests; the console scripts' start-up
(fli.cli.common) composes inside :func:`hydra_context` with :func:`compose_one`, then hands the
overrides to Hydra's runner.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from fli.config import Config, ConfigError, register_configs


def conf_dir() -> Path:
    """The ``conf/`` tree: ``$FLI_CONF_DIR``, else the one beside the installed package."""
    env = os.environ.get("FLI_CONF_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "conf"
    if not (path / "config.yaml").is_file():
        raise ConfigError(f"config tree not found: {path}/config.yaml (set FLI_CONF_DIR to the conf/ folder)")
    return path


def register_resolvers() -> None:
    # ${fli.now:}: this process's clock as <date>_<time> with milliseconds, the run-directory
    # stamp of conf/config.yaml (Hydra's ${now:} has no milliseconds)
    def stamp() -> str:
        now = _dt.datetime.now()
        return now.strftime("%Y-%m-%d_%H-%M-%S-") + f"{now.microsecond // 1000:03d}"

    OmegaConf.register_new_resolver("fli.now", stamp, use_cache=True, replace=True)


def hydra_errors() -> tuple[type[BaseException], ...]:
    from hydra.errors import HydraException  # noqa: PLC0415
    from omegaconf.errors import OmegaConfBaseException  # noqa: PLC0415

    return HydraException, OmegaConfBaseException


@contextlib.contextmanager
def hydra_context(command: str):
    """Hydra's compose API on ``conf/``, with ``hydra.job.name`` = ``command``."""
    from hydra import initialize_config_dir  # noqa: PLC0415
    from hydra.core.global_hydra import GlobalHydra  # noqa: PLC0415

    register_configs()
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), job_name=command, version_base="1.3"):
        yield


def compose_one(overrides: list[str], where: str = "") -> tuple[Config, dict, DictConfig]:
    """Inside :func:`hydra_context`: (typed config, resolved plain dict, composed config with its hydra node)."""
    from hydra import compose as hcompose  # noqa: PLC0415

    from fli.config import to_config  # noqa: PLC0415

    try:
        full = hcompose(config_name="config", overrides=overrides, return_hydra_config=True)
        task = copy.deepcopy(full)
        with open_dict(task):
            del task["hydra"]
        cfg = to_config(task)
        resolved = OmegaConf.to_container(task, resolve=True)
    except ConfigError as e:
        key, _, head = str(e).partition(": ")
        raise ConfigError(f"{e}{suggestion(head, key)}{where}") from None
    except hydra_errors() as e:
        raise ConfigError(one_line(e) + where) from None
    return cfg, resolved, full


def compose(overrides: list[str]) -> tuple[Config, dict]:
    """Compose and validate; returns the typed config and the resolved plain dict."""
    with hydra_context("app"):
        cfg, resolved, _ = compose_one(list(overrides))
    return cfg, resolved


def one_line(e: BaseException) -> str:
    msg = str(e).strip()
    cause = e.__cause__ or e.__context__
    if cause is not None and str(cause).strip():
        msg = str(cause).strip()
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("full_key", "object_type", "reference_type"))]
    full_key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key")), "")
    head = keep[0] if keep else type(e).__name__
    if head.startswith("Ambiguous value"):
        head += " (a list: key=[a,b]; a string: key='a,b'; a sweep: add -m)"
    line = f"{full_key}: {head}" if full_key and full_key not in head else head
    return line + suggestion(head, full_key)


def suggestion(head: str, full_key: str) -> str:
    """What the user may have meant: the close matches of a mistyped key among its section's
    keys, or the options of a config group that has no such option."""
    import difflib  # noqa: PLC0415
    import re  # noqa: PLC0415

    m = re.match(r"Key '([^']+)' not in '(\w+)'", head)
    if m:
        import dataclasses  # noqa: PLC0415

        from fli import config as schema  # noqa: PLC0415  (every section's dataclass)

        cls = getattr(schema, m.group(2), None)
        if cls is None or not dataclasses.is_dataclass(cls):
            return ""
        fields = [f.name for f in dataclasses.fields(cls)]
        prefix = full_key.rsplit(".", 1)[0] + "." if "." in full_key else ""
        close = difflib.get_close_matches(m.group(1), fields, n=3, cutoff=0.6)
        if close:
            return f"; did you mean {' or '.join(prefix + c for c in close)}?"
        return f"; the keys of {prefix.rstrip('.') or 'the config'} are: {', '.join(fields)}"
    m = re.search(r"Could not find '([\w/]+)/([^'/]+)'", head)
    if m:
        group = conf_dir() / m.group(1)
        options = sorted(p.stem for p in group.glob("*.yaml")) if group.is_dir() else []
        if options:
            close = difflib.get_close_matches(m.group(2), options, n=1, cutoff=0.6)
            hint = f"did you mean {m.group(1)}={close[0]}? " if close else ""
            return f": {hint}the {m.group(1)} options are {', '.join(options)}"
    return ""
