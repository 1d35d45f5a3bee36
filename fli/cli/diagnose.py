"""``fli-diagnose``: ArviZ's diagnostics of fli-sample and fli-nuts chains, with verdicts, figures and a report.

``fli-diagnose runs=[dir1,dir2]`` or ``fli-diagnose sweep=<fli-sample or fli-nuts multirun dir>``
[``diagnose.*`` overrides] [``run_dir=...``]. Reads only complete chunks, so it runs while the
chains still sample. Exit status: 0 pass, 3 warn, 4 fail (the report is written); 2 bad input
(one ``fli-diagnose: error: ...`` line on stderr, no report), as for every fli command; 1 a
crash. Writes ``diagnostics.json``, ``chains.nc``, figures and ``report.html``; see
:mod:`fli.infer.diagnose.run` and docs/diagnose.md. Example:
``fli-diagnose runs=[outputs/sample/a,outputs/sample/b] run_dir=outputs/diagnose/ab``.
"""

from __future__ import annotations

from fli.cli.common import verdict_main


def _run(*args) -> dict:
    from fli.infer.diagnose.run import run_diagnose  # noqa: PLC0415  (not imported for --help or a bad key)

    return run_diagnose(*args)


def main(argv: list[str] | None = None) -> int:
    return verdict_main("diagnose", _run, argv, about=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
