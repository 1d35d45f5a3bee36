"""``fli-diagnose``: ArviZ's diagnostics of fli-sample and fli-nuts chains, with verdicts, figures and a report.

``fli-diagnose runs=[dir1,dir2]`` or ``fli-diagnose sweep=<fli-sample or fli-nuts multirun dir>``
[``diagnose.*`` overrides] [``run_dir=...``]. Reads only complete chunks, so it runs while the
chains still sample. Exit status: 0 pass, 3 warn, 4 fail (the report is written); 2 bad input
(one ``fli-diagnose: error: ...`` line on stderr, no report), as for every fli command; 1 a
crash. See :mod:`fli.infer.diagnose.run` and docs/diagnose.md.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fli.cli.common import main_wrapper
from fli.config import Config


def main(argv: list[str] | None = None) -> int:
    statuses: list[int] = []

    def body(cfg: Config, resolved: dict, run_dir: Path, log: logging.Logger) -> None:
        from fli.infer.diagnose.run import run_diagnose  # noqa: PLC0415

        statuses.append(run_diagnose(cfg, resolved, run_dir, log)["exit_status"])

    code = main_wrapper("diagnose", body, argv, about=__doc__)
    # main_wrapper returns 0 for a job that ran; the verdict of the chains is ours to report
    return code if code or not statuses else max(statuses)


if __name__ == "__main__":
    raise SystemExit(main())
