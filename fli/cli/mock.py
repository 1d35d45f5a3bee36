"""``fli-mock``: draw the truth, run the forward model, add shape noise, write the observation.

The command around :func:`fli.mock.make_mock` and :func:`fli.mock.write_mock`, which write into
its run directory: ``config.yaml`` (resolved), ``mock.zarr`` (see :mod:`fli.store.io`; readable with
:func:`fli.store.io.load_mock` on any device layout), ``summary.json`` and figures (``kappa_maps.png``,
``matter_power.png``, ``kappa_cl.png``). Nothing is required. Example:
``fli-mock experiment=laptop seed=3 run_dir=outputs/mock/laptop``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fli.cli.common import main_wrapper
from fli.config import Config, ConfigError
from fli.store.manifest import check_kind
from fli.mock import make_mock, write_mock


def _body(cfg: Config, resolved: dict, run_dir: Path, log: logging.Logger) -> None:
    from fli.store.io import MOCK_NAME  # noqa: PLC0415

    check_kind(run_dir, "fli-mock")
    if (Path(run_dir) / MOCK_NAME).exists():
        raise ConfigError(f"run_dir {run_dir} already holds a mock: choose another run_dir")
    m = make_mock(cfg, log)
    write_mock(run_dir, cfg, resolved, m, log)


def main(argv: list[str] | None = None) -> int:
    return main_wrapper("mock", _body, argv, about=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
