"""Write docs/config.md, the configuration reference, from the schemas and the composed default
config: ``python -m fli.cli.reference [path]`` (default: docs/config.md beside conf/)."""

from __future__ import annotations

import sys
from pathlib import Path


def default_page() -> str:
    """The page for today's schemas and ``conf/`` (the experiment-free default config)."""
    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.config.reference import render  # noqa: PLC0415

    _, resolved = compose(["run_dir=.", "compilation_cache=null"])  # stamps and paths of this machine left out
    resolved.pop("run_dir", None)
    return render(resolved)


def main(argv: list[str] | None = None) -> int:
    from fli.cli.compose import conf_dir  # noqa: PLC0415

    argv = list(sys.argv[1:] if argv is None else argv)
    path = Path(argv[0]) if argv else conf_dir().parent / "docs" / "config.md"
    path.write_text(default_page())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
