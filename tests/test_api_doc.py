"""docs/api.md's log-density example runs as written, on the small mock (its overrides and path
put in place of the laptop experiment's), and gives what the posterior itself gives."""

import re
from pathlib import Path

import numpy as np

PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_the_api_pages_log_density_runs_and_is_the_posteriors(small_mock, capsys):
    from tests.helpers.posterior import SMALL

    code = re.search(r"## The posterior as a log density\n\n```python\n(.*?)```", PAGE.read_text(), re.S).group(1)
    assert 'compose(["experiment=laptop"])' in code and '"outputs/laptop/mock"' in code
    code = code.replace('compose(["experiment=laptop"])', f"compose({SMALL!r})").replace(
        '"outputs/laptop/mock"', repr(str(small_mock)))
    scope: dict = {}
    exec(compile(code, str(PAGE), "exec"), scope)  # noqa: S102  the page's own code
    post, data, x0 = scope["post"], scope["data"], scope["x0"]
    assert np.isfinite(float(scope["value"])) and np.all(np.isfinite(np.asarray(scope["grad"])))
    np.testing.assert_allclose(float(scope["value"]), -float(post.potential_flat(x0, data)), rtol=1e-6)
    # the prior's median: the uniform priors' midpoints (conf/prior/default.yaml)
    p = scope["post"].params(scope["theta"])
    assert abs(float(p["Omega_c"]) - 0.30) < 1e-6 and abs(float(p["sigma8"]) - 0.80) < 1e-6
    assert "Omega_c" in capsys.readouterr().out
