"""``fli-pipeline``: from an observation to a diagnosed posterior in one command.

``fli-pipeline [mock=<observation dir>] [overrides]``: a mock (unless ``mock=`` names an
observation), the MAP (and MUSE where configured), chains started from the MAP, and their
diagnosis, each stage in its own subdirectory of ``run_dir``. Started again on the same
``run_dir`` it continues where it stopped. Exit status: the diagnosis's verdict, 0 pass, 3 warn,
4 fail; 2 bad input. See :mod:`fli.pipeline`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fli.cli.common import main_wrapper
from fli.config import Config


def main(argv: list[str] | None = None) -> int:
    statuses: list[int] = []

    def body(cfg: Config, resolved: dict, run_dir: Path, log: logging.Logger) -> None:
        from fli.pipeline import run_pipeline  # noqa: PLC0415

        statuses.append(run_pipeline(cfg, resolved, run_dir, log)["exit_status"])

    code = main_wrapper("pipeline", body, argv, about=__doc__)
    return code if code or not statuses else max(statuses)


if __name__ == "__main__":
    raise SystemExit(main())
