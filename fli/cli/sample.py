"""``fli-sample``: sample the cosmological parameters and the initial field with any kernel.

``fli-sample mock=<fli-mock run dir or observation dir> [init=prior|truth|<fli-map run dir>]
[inference.kernel=nuts|hmc|mclmc|adjusted_mclmc] [overrides]``; resumable: started again on the
same ``run_dir`` it continues after the last complete chunk. ``fli-nuts`` is the same command
for NumPyro's kernels; each continues the other's runs. See :mod:`fli.infer.sample.run` for what it
writes and docs/nuts.md for how to use it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fli.cli.common import main_wrapper
from fli.config import Config


def _body(cfg: Config, resolved: dict, run_dir: Path, log: logging.Logger) -> None:
    from fli.infer.sample.run import run_chains  # noqa: PLC0415

    run_chains(cfg, resolved, run_dir, log, command="fli-sample")


def main(argv: list[str] | None = None) -> int:
    return main_wrapper("sample", _body, argv, about=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
