"""``fli-sample``: sample the cosmological parameters and the initial field with any kernel.

``fli-sample observation=<fli-observe dir or fli-mock run> [init=prior|truth|<fli-map run dir>]
[inference.kernel=mclmc|adjusted_mclmc|nuts|hmc] [overrides]`` (``observation=``, or ``mock=``,
required); resumable: started again on the same ``run_dir`` it continues after the last complete
chunk. Writes each chunk's draws (``chunks/``), ``posterior.nc`` (ArviZ), ``nuts.json``, the
field's running mean and variance (``running.zarr``), thinned fields and checkpoints. Example:
``fli-sample experiment=laptop observation=outputs/mock/laptop init=outputs/map/laptop run_dir=outputs/sample/laptop``. Its kernel is MCLMC unless the
command line sets ``inference.kernel``: 2.9x NUTS's S8 effective samples per gradient on tiny
PM (docs/benchmarks.md). Chains on a field above tiny's 16k cells start from a fli-map run
(``init=<its run dir>``), or use fli-pipeline, which makes one. ``fli-nuts`` is the same command
for NumPyro's kernels; each continues the other's runs. See :mod:`fli.infer.sample.run` for what it
writes and docs/nuts.md for how to use it.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from fli.cli.common import main_wrapper, with_defaults
from fli.config import Config


def _body(cfg: Config, resolved: dict, run_dir: Path, log: logging.Logger) -> None:
    from fli.infer.sample.run import run_chains  # noqa: PLC0415

    run_chains(cfg, resolved, run_dir, log, command="fli-sample")


# fli-sample's own default where the command line leaves the key unset (the config's, NUTS, is
# fli-nuts'): MCLMC at its 5e-6 energy-error target gets 37.4 S8 bulk ESS per 1000 gradients on
# tiny PM, 2.9x NUTS's 12.9, bias under 0.05 posterior sd (docs/benchmarks.md, "Tiny PM, 4 x 4000")
DEFAULTS = {"inference.kernel": "mclmc"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return main_wrapper("sample", _body, with_defaults(argv, DEFAULTS), about=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
