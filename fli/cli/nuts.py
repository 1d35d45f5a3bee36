"""``fli-nuts``: NumPyro's NUTS or HMC over the cosmological parameters and the initial field.

``fli-nuts observation=<fli-observe dir or fli-mock run> [init=prior|truth|<fli-map run dir>]
[inference.kernel=nuts|hmc] [overrides]`` (``observation=``, or ``mock=``, required): ``fli-sample`` for NumPyro's two kernels, the same
run and outputs (each command continues the other's runs); MCLMC runs through ``fli-sample``.
Resumable: started again on the same ``run_dir`` it continues after the last complete chunk.
See :mod:`fli.infer.sample.run` for what it writes and docs/nuts.md for how to use it. Example:
``fli-nuts experiment=tiny observation=outputs/mock/tiny init=outputs/map/tiny run_dir=outputs/nuts/tiny``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fli.cli.common import main_wrapper
from fli.config import Config, ConfigError

NUTS_KERNELS = ("nuts", "hmc")


def _body(cfg: Config, resolved: dict, run_dir: Path, log: logging.Logger) -> None:
    from fli.infer.sample.run import run_chains  # noqa: PLC0415

    kernel = cfg.inference.kernel
    if kernel not in NUTS_KERNELS:
        raise ConfigError(f"inference.kernel={kernel}: fli-nuts runs NumPyro's 'nuts' or 'hmc'; run fli-sample for "
                          f"{kernel} (the same run and outputs, any kernel)")
    run_chains(cfg, resolved, run_dir, log, command="fli-nuts")


def main(argv: list[str] | None = None) -> int:
    return main_wrapper("nuts", _body, argv, about=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
