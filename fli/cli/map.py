"""``fli-map``: MAP of the cosmological parameters and the initial field, with a Laplace error,
then MUSE where ``inference.map.estimator=muse``.

``fli-map mock=<fli-mock run dir or observation dir> [overrides]``; resumable: started again
on the same ``run_dir`` it continues from the last complete checkpoint. See
:mod:`fli.infer.fit.map` for what it writes.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fli.cli.common import main_wrapper
from fli.config import Config


def _body(cfg: Config, resolved: dict, run_dir: Path, log: logging.Logger) -> None:
    from fli.infer.fit import fit_map  # noqa: PLC0415
    from fli.infer.muse import MUSE  # noqa: PLC0415

    fit_map(cfg, resolved, run_dir, log, estimators={"muse": MUSE})


def main(argv: list[str] | None = None) -> int:
    return main_wrapper("map", _body, argv, about=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
