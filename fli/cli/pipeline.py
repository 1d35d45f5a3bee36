"""``fli-pipeline``: from an observation to a diagnosed posterior in one command.

``fli-pipeline [experiment=laptop] [observation=<dir>] [run_dir=<dir>] [overrides]``: a mock
(unless ``observation=``, or its alias ``mock=``, names one: a fli-observe directory or a
fli-mock run), the MAP (and MUSE with ``inference.map.estimator=muse``), chains started from
the MAP, and their diagnosis; it writes each stage into its own subdirectory of ``run_dir`` (mock/, map/,
sample/, diagnose/ with report.html; pipeline.json with each stage's cost). Nothing is
required. Started again on the same ``run_dir`` it continues where it stopped. Its chains are 4
of MCLMC's, vectorised (``inference.kernel=mclmc inference.chains_per_run=4``, the best
measured per gradient) unless the command line sets those keys. Exit status: the diagnosis's
verdict, 0 pass, 3 warn, 4 fail; 2 bad input. Example:
``fli-pipeline experiment=laptop run_dir=outputs/laptop``. See :mod:`fli.pipeline`.
"""

from __future__ import annotations

import sys

from fli.cli import common
from fli.cli.common import verdict_main


# fli-pipeline's own defaults where the command line leaves a key unset: the best measured. MCLMC
# at its 5e-6 energy-error target: S8 bulk ESS per 1000 gradients 37.4 on tiny PM, 2.9x NUTS's,
# bias under 0.05 posterior sd, with 4 vectorised chains, which R-hat compares (docs/benchmarks.md,
# "Tiny PM, 4 x 4000").
DEFAULTS = {"inference.kernel": "mclmc", "inference.chains_per_run": 4}


def with_defaults(argv: list[str]) -> list[str]:
    """``argv`` with :data:`DEFAULTS` put first for the keys it does not set."""
    return common.with_defaults(argv, DEFAULTS)


def _run(*args) -> dict:
    from fli.pipeline import run_pipeline  # noqa: PLC0415  (not imported for --help or a bad key)

    return run_pipeline(*args)


def main(argv: list[str] | None = None) -> int:
    return verdict_main("pipeline", _run, with_defaults(list(sys.argv[1:] if argv is None else argv)), about=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
