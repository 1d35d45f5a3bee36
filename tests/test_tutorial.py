"""docs/tutorial.ipynb runs end to end, as a reader runs it (a Jupyter kernel, cell after cell),
and shows what it says it shows: every stage's cost, the parameters' estimates, the corner plot,
ArviZ's summary and the log density."""

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "tutorial.ipynb"


@pytest.mark.slow(seconds=190)  # fresh-clone CI of 2143777: 187 s; a small fli-pipeline (mock, MAP, 4 chains of 300 transitions) in a kernel
def test_the_tutorial_notebook_runs_end_to_end(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = {i: "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in c.get("outputs", []))
            for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    out = "\n".join(text.values())
    assert "exit status" in out and all(s in out for s in ("mock", "map", "sample", "diagnose")), out[-2000:]
    assert "verdict:" in out and "posterior" in out and "truth in the 99 % interval" in out, out[-2000:]
    assert "r_hat" in out and "ess_bulk" in out, out[-2000:]  # ArviZ's summary table
    assert "log density at the prior's median" in out, out[-2000:]
    assert len(images) == 1  # the corner plot
