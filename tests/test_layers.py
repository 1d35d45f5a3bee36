"""The layers' import contracts hold: pyproject.toml's [tool.importlinter], run with import-linter.

Physics and the forward model import no fli.infer, fli.cli or fli.store.io; fli.infer imports no
fli.cli; and every module directly under fli/ sits in a layer (cli > infer | mock > io | forward
| plots > files > physics > config) that imports only layers below it. By hand: ``lint-imports``
from the repository root.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports() -> str:
    # the script of the environment running the tests (sys.executable's bin dir), else PATH's
    exe = Path(sys.executable).parent / ("lint-imports.exe" if os.name == "nt" else "lint-imports")
    found = str(exe) if exe.exists() else shutil.which("lint-imports")
    assert found, 'lint-imports not found: install the test extra, pip install -c constraints.txt -e ".[test]"'
    return found


def test_import_contracts_hold():
    # from the repository root: it reads pyproject.toml there and analyses the checkout's fli;
    # no cache directory written; wide lines, so that rich wraps no contract name or chain
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.run([_lint_imports(), "--no-cache"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"lint-imports exited with {proc.returncode}:\n{out}"
    assert "0 broken" in out, out


def test_no_module_imports_one_that_imports_it_back():
    # every import, function-level ones included (grimp reads them all): a cycle is a pair
    # a -> b with a chain of imports from b back to a
    import grimp

    graph = grimp.build_graph("fli", cache_dir=None)
    cycles = sorted((a, b) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)
                    if graph.chain_exists(importer=b, imported=a))
    assert not cycles, f"import cycles (importer, imported): {cycles}"


def test_no_module_is_longer_than_600_lines():
    # a module past ~500 lines holds two; 600 is the limit the layout keeps
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "fli").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"modules over 600 lines: {long}"
