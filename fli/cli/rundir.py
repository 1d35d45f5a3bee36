"""Run directories shared by every process, and taking back what Hydra wrote for a refused run.

Hydra creates a run's directory and its ``.hydra/`` before the task function runs; a body that
then refuses its config (``ConfigError``) must leave nothing behind, so :func:`undo` removes
what Hydra wrote, from what :class:`Before` recorded, and keeps whatever the body wrote.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fli.config import ConfigError


@dataclass
class Before:
    """What a run directory held before Hydra wrote into it, to undo that after a refusal."""

    existed: bool
    hydra_files: dict[str, bytes] | None = None  # its .hydra/ (name -> bytes); None: not known
    new_parents: list[Path] = field(default_factory=list)  # ancestors this run creates, deepest first

    @classmethod
    def of(cls, path: Path, subdir: str | None) -> Before:
        new_parents, p = [], path.absolute().parent
        while not p.exists():
            new_parents.append(p)
            p = p.parent
        if not path.exists():
            return cls(False, None, new_parents)  # None: .hydra/ goes only if the body wrote nothing
        files = {}
        if subdir is not None and (path / subdir).is_dir():
            files = {f.name: f.read_bytes() for f in (path / subdir).iterdir() if f.is_file()}
        return cls(True, files, new_parents)


def undo(path: Path, before: Before, subdir: str | None, rank0: bool, fs_fault: bool = False) -> None:
    """Take back what Hydra wrote for a run its body refused: its ``.hydra/`` (restored where it
    was there before), and the directory and its parents where this run made them and they are
    empty. What the body itself wrote stays, except after a file-system fault (a full disk) in
    a directory this run made: then its partial outputs go too, unless it holds a complete
    checkpoint to resume from."""
    if fs_fault and rank0 and not before.existed and path.is_dir() and not _has_checkpoint(path):
        for p in path.iterdir():
            if p.name != subdir:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    hydra_dir = path / subdir if subdir is not None else None
    if hydra_dir is not None and rank0:
        others = [p for p in path.iterdir() if p.name != subdir] if path.is_dir() else []
        if before.hydra_files is not None:
            if hydra_dir.is_dir():
                for f in hydra_dir.iterdir():
                    if f.is_file() and f.name not in before.hydra_files:
                        f.unlink()
            if before.hydra_files:
                hydra_dir.mkdir(exist_ok=True)
                for name, data in before.hydra_files.items():
                    (hydra_dir / name).write_bytes(data)
            else:
                _rmdir(hydra_dir)
        elif not others:
            shutil.rmtree(hydra_dir, ignore_errors=True)
    if not before.existed:
        for p in [path, *before.new_parents]:
            if not _rmdir(p):
                break


def _has_checkpoint(run: Path) -> bool:
    """Whether ``run`` holds a committed checkpoint (``checkpoints/<step>/commit_success.txt``)."""
    return any(run.glob("checkpoints/[0-9]*/commit_success.txt"))


def _rmdir(p: Path) -> bool:
    try:
        p.rmdir()  # only if empty
        return True
    except OSError:
        return not p.exists()


# file-system faults a user can fix: reported in one line (exit 2), never as a traceback
FS_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR,
             errno.EEXIST)


def fs_fault(e: OSError, run_dir: Path | None) -> str | None:
    """One line for a file-system fault the user can fix (a full disk, no permission, a path
    under a file), naming the file or else the run directory; None for any other OSError."""
    if not isinstance(e, OSError) or e.errno not in FS_ERRNOS or isinstance(e, FileNotFoundError):
        return None
    where = f" {e.filename}" if e.filename else f" in {run_dir}" if run_dir is not None else ""
    return f"cannot write{where}: {e.strerror or e}"


def check_writable(path: Path, key: str = "run_dir") -> None:
    """Refuse, in one line, a run directory that cannot be made: a path under a regular file,
    or a place where nothing can be written (permissions, an immutable or read-only parent).
    Writes (and removes) an empty temporary directory in the nearest existing ancestor."""
    p = Path(path).absolute()
    anc = p
    while not anc.exists() and not anc.is_symlink():
        anc = anc.parent
    if not anc.is_dir():
        raise ConfigError(f"{key}={path}: {anc} is a file, not a directory: choose another {key}")
    try:
        probe = tempfile.mkdtemp(prefix=".fli-write-test-", dir=anc)
        os.rmdir(probe)
    except OSError as e:
        raise ConfigError(f"{key}={path}: nothing can be written in {anc} ({e.strerror or e}): choose another "
                          f"{key} or fix its permissions") from None


def quote(path: str) -> str:
    """``path`` as a quoted value of a Hydra override (backslashes escaped only before a quote)."""
    s = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", path)
    s = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, s)
    return f"'{s}'"


def drop_keys(overrides: list[str], keys: tuple[str, ...]) -> list[str]:
    return [o for o in overrides if o.split("=", 1)[0].lstrip("+") not in keys]
