"""``fli-nuts``: NUTS/HMC over the cosmological parameters and the initial field, one chain.

``fli-nuts mock=<fli-mock run dir or observation dir> [init=prior|truth|<fli-map run dir>]
[overrides]``; resumable: started again on the same ``run_dir`` it continues after the last
complete chunk. See :mod:`fli.infer.sample` for what it writes and docs/nuts.md for how to use it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fli.cli.common import main_wrapper
from fli.config import Config


def _body(cfg: Config, resolved: dict, run_dir: Path, log: logging.Logger) -> None:
    from fli.infer.sample import run_nuts  # noqa: PLC0415

    run_nuts(cfg, resolved, run_dir, log)


def main(argv: list[str] | None = None) -> int:
    return main_wrapper("nuts", _body, argv)


if __name__ == "__main__":
    raise SystemExit(main())
