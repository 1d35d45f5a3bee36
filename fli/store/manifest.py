"""Run directories that say what they are: ``fli-run.json``, read first by every command.

Each command writes, once its run is known to be valid (the config checked, the observation
read, a resume allowed), a small manifest in its run directory::

    {"command": "fli-nuts", "fli_version": "0.1.0", "config_sha256": "...",
     "observation": {"path": "/abs/path/mock.zarr", "fingerprint": "..."}}

and every command reads it before anything else (:func:`check_kind`): a directory of another
command is refused in one line that says what it is. A directory written before manifests
existed is recognised by its files (:func:`kind_of`).

The observation's fingerprint (:mod:`fli.store.fingerprint`) is what a resume, an extension, a start
from a MAP and a combination of chains compare (:func:`check_same_observation`), never its path.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fli import __version__
from fli.config import ConfigError
from fli.store.files import write_json
from fli.store.fingerprint import short

MANIFEST = "fli-run.json"
# files that mark a run directory of each command, for directories written before manifests
_MARKS = (("fli-map", ("map.json", "loss_history.csv", "map_field.zarr")),
          ("fli-nuts", ("nuts.json", "chunks", "running.zarr", "chain_0")),
          ("fli-diagnose", ("diagnostics.json", "chains.nc")),
          ("fli-mock", ("mock.zarr",)))
# fli-sample and fli-nuts write the same kind of run (fli-nuts is fli-sample for NumPyro's kernels):
# each resumes, extends and diagnoses the other's
SAMPLING = ("fli-sample", "fli-nuts")
USES = {"fli-map": "a new run_dir or a fli-map run to resume",
        "fli-sample": "a new run_dir or a fli-sample/fli-nuts run",
        "fli-nuts": "a new run_dir or a fli-sample/fli-nuts run",
        "fli-diagnose": "a new run_dir", "fli-mock": "a new run_dir",
        "fli-pipeline": "a new run_dir or a fli-pipeline run to continue"}


def same_kind(kind: str, command: str) -> bool:
    """Whether a run made by ``kind`` is one that ``command`` may continue."""
    return kind == command or (kind in SAMPLING and command in SAMPLING)


def config_sha256(resolved: dict) -> str:
    """SHA-256 of a resolved config (keys sorted)."""
    return hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()


def read_manifest(run_dir: Path) -> dict | None:
    """The manifest of a run directory, or None where it has none (or an unreadable one)."""
    f = Path(run_dir) / MANIFEST
    try:
        m = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and "command" in m else None


def kind_of(run_dir: Path) -> str | None:
    """Which command made a directory: its manifest's, else the one its files mark; None for
    a directory that is empty, missing or of none of fli's commands."""
    m = read_manifest(run_dir)
    if m is not None:
        return str(m["command"])
    d = Path(run_dir)
    if not d.is_dir():
        return None
    for command, marks in _MARKS:
        if any((d / name).exists() for name in marks):
            return command
    return None


def check_kind(run_dir: Path, command: str, what: str = "run_dir") -> None:
    """Refuse a directory made by another command, in one line saying what it is."""
    kind = kind_of(run_dir)
    if kind is not None and not same_kind(kind, command):
        raise ConfigError(f"{what} {run_dir} is a {kind} run; {command} needs {USES.get(command, 'a new run_dir')}")


def write_manifest(run_dir: Path, command: str, resolved: dict, obs=None) -> dict:
    """Write the run's manifest (process 0; written aside and renamed); returns it."""
    m = {"command": command, "fli_version": __version__, "config_sha256": config_sha256(resolved)}
    if obs is not None:
        m["observation"] = {"path": str(Path(obs.path).absolute()) if obs.path is not None else None,
                            "fingerprint": obs.fingerprint}
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    write_json(Path(run_dir) / MANIFEST, m)
    return m


def check_same_observation(recorded: dict | None, obs, what: str, legacy_path: str | None = None) -> None:
    """Refuse ``obs`` where a run recorded another observation.

    ``recorded``: the run's manifest's ``observation`` (None for a run written before
    manifests: then its config's ``mock`` path, ``legacy_path``, is compared after resolving,
    so that another spelling of the same path is accepted). ``what`` names the run.
    """
    here = str(Path(obs.path).absolute()) if getattr(obs, "path", None) is not None else "?"
    if recorded is None or recorded.get("fingerprint") is None or obs.fingerprint is None:
        if legacy_path is not None and Path(legacy_path).resolve() != Path(obs.path).resolve().parent and \
                Path(legacy_path).resolve() != Path(obs.path).resolve():
            raise ConfigError(f"{what} was made with mock={legacy_path}, not {here} (neither has a fingerprint to "
                              f"compare): use the same observation or a new run_dir")
        return
    if recorded["fingerprint"] != obs.fingerprint:
        raise ConfigError(f"{what} was made with another observation: fingerprint {short(recorded['fingerprint'])} "
                          f"({recorded.get('path')}), this one is {short(obs.fingerprint)} ({here}): its data "
                          f"changed; use a new run_dir or the observation it was made with")
