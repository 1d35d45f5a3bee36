"""``fli-map``: MAP of the cosmological parameters and the initial field, with a Laplace error,
then MUSE where ``inference.map.estimator=muse``.

``fli-map observation=<fli-observe dir or fli-mock run> [overrides]`` (``mock=`` is the same
key; required); resumable: started again on the same ``run_dir`` it continues from the last
complete checkpoint. Writes ``map.json`` (the MAP, its Laplace errors, MUSE's block),
``map_field.zarr``, ``loss_history.csv``, checkpoints and figures; see :mod:`fli.infer.fit.map`.
Example: ``fli-map experiment=laptop observation=outputs/mock/laptop run_dir=outputs/map/laptop``.
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
