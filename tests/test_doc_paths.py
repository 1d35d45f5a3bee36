"""Every path and module that the README, the user docs, the configs and fli's own docstrings name
exists: a file moved or renamed fails here until the text follows it.

Left out: this file's own examples, and the records of past studies (docs/bench/ and the study write-ups below), whose commands
stay as they were run; scripts/README.md maps their old script paths to today's.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDS = {"docs/benchmarks.md", "docs/muse_studies.md", "docs/fidelity.md"}
TEXTS = sorted(
    [ROOT / "README.md", ROOT / "scripts" / "README.md", ROOT / ".ci" / "run", ROOT / "pyproject.toml"]
    + [p for p in (ROOT / "docs").glob("*.md") if str(p.relative_to(ROOT)) not in RECORDS]
    + [p for d in ("fli", "tests", "scripts") for p in (ROOT / d).rglob("*.py") if p.name != "test_doc_paths.py"]
    + list((ROOT / "conf").rglob("*.yaml")) + [p for p in (ROOT / "scripts").rglob("*") if p.suffix in (".sh", ".sbatch")])

# a repository path: a top folder of this checkout, then names without placeholders (<name>, *)
PATH = re.compile(r"(?<![\w/.<-])((?:fli|tests|scripts|docs|conf)/[\w./-]*\w\.(?:py|md|yaml|sh|sbatch|json|png|txt))"
                  r"(?![\w/<*])")
# a dotted name from fli; not a logger's name in quotes, nor a Hydra resolver (${fli.now:})
MODULE = re.compile(r"(?<![\w./{'\"-])(fli(?:\.[A-Za-z_]\w*)+)(?![\w:'\"])")
SCRIPT = re.compile(r"python -m (scripts(?:\.\w+)+)(?![\w.])")


def _names(pattern, text):
    return sorted({m.group(1).rstrip(".") for m in pattern.finditer(text)})


def _missing_module(dotted: str) -> str | None:
    """None when ``dotted`` names a module or an attribute of one; else what is missing."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if found:
            if n == len(parts):
                return None
            mod = importlib.import_module(name)
            # the next part must be a name in the module (deeper attributes are not followed)
            return None if hasattr(mod, parts[n]) else f"{name} has no {parts[n]}"
    return f"no module {parts[0]}"


@pytest.mark.parametrize("text", TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_paths_and_modules_exist(text):
    body = text.read_text().split("## Where the scripts were")[0]  # scripts/README.md's old paths are history
    # (a study's record under docs/bench/ may be named as an output before it is written)
    missing = [p for p in _names(PATH, body) if not (ROOT / p).exists() and not p.startswith("docs/bench/")]
    missing += [f"{m} ({why})" for m in _names(MODULE, body) if (why := _missing_module(m))]
    missing += [s for s in _names(SCRIPT, body) if not (ROOT / (s.replace(".", "/") + ".py")).is_file()]
    assert not missing, f"{text.relative_to(ROOT)} names what does not exist: {missing}"


def test_the_check_sees_a_moved_path():
    # the patterns catch the kinds of reference a move breaks (not a test that cannot fail)
    text = "see fli/infer/mclmc.py, fli.infer.map.fit_map and python -m scripts.benchmark_chains"
    assert _names(PATH, text) == ["fli/infer/mclmc.py"] and not (ROOT / "fli/infer/mclmc.py").exists()
    assert _missing_module("fli.infer.map.fit_map") and _missing_module("fli.infer.fit.map.fit_map") is None
    assert _names(SCRIPT, text) == ["scripts.benchmark_chains"]
