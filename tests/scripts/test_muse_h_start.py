"""scripts/studies/muse_h_start.py's report: H's columns, the warm-minus-cold pairs and the secant's change
with the step, checked on synthetic scores whose mean is a known polynomial of theta'."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("studies/muse_h_start")


def _write(path, script, n_sims, slope, cubic, warm_offset, rng, theta=(0.0, 0.3)):
    """Scores g_k(t) = g0_k + slope t + cubic t^3 (t the shift of theta' in column 1), the same
    draw g0_k for every shift of simulation k (common random numbers), the warm fits off by
    ``warm_offset``."""
    lines = []
    for k in range(n_sims):
        g0 = rng.normal(size=2)
        lines.append({"name": f"sim{k}/cold/at", "score": g0.tolist(), "evals": 100, "theta": list(theta)})
        for d in (0.2, 0.5):
            for sign in (1, -1):
                t = sign * d
                g = g0 + np.array([0.0, slope * t + cubic * t**3])
                lines.append({"name": script._name(k, "cold", 1, sign, d), "score": g.tolist(), "evals": 100,
                              "theta": list(theta)})
                lines.append({"name": script._name(k, "warm", 1, sign, d), "score": (g + warm_offset * t).tolist(),
                              "evals": 60, "theta": list(theta)})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_recovers_the_slope_the_warm_offset_and_the_cubic(script, tmp_path):
    rng = np.random.default_rng(0)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(a, script, 5, slope=7.0, cubic=2.0, warm_offset=0.5, rng=rng)
    _write(b, script, 5, slope=7.0, cubic=2.0, warm_offset=0.5, rng=rng)
    b.write_text(b.read_text().replace('"sim', '"sim1'))  # the second process's simulations: 10-14
    out = tmp_path / "h.json"
    script.main(["--report", str(a), str(b), "--json", str(out)])
    r = json.loads(out.read_text())
    assert r["n_sims_at_theta"] == 10
    c02, c05 = r["columns"]["1@0.2"], r["columns"]["1@0.5"]
    # the central secant of slope t + cubic t^3 over +-d is slope + cubic d^2, exactly: the common
    # random numbers cancel g0, so the only error is float rounding
    assert c02["cold"]["H_column"][1] == pytest.approx(7.0 + 2.0 * 0.04, abs=1e-9)
    assert c05["cold"]["H_column"][1] == pytest.approx(7.0 + 2.0 * 0.25, abs=1e-9)
    assert c02["cold"]["n"] == 10 and c02["cold"]["se"][1] == pytest.approx(0.0, abs=1e-9)
    # the warm fits' extra warm_offset t adds warm_offset to the secant of each component
    assert c02["warm_minus_cold"]["mean"] == pytest.approx([0.5, 0.5], abs=1e-9)
    assert c05["cold_minus_smallest_step"]["mean"][1] == pytest.approx(2.0 * (0.25 - 0.04), abs=1e-9)
    assert c02["cold"]["evals_mean"] == 100 and c02["warm"]["evals_mean"] == 60
    # the response curve, paired with each simulation's score at theta: slope t + cubic t^3 itself
    curve = r["response"]["1"]
    assert list(curve) == ["-0.5", "-0.2", "+0.2", "+0.5"]
    for t, row in curve.items():
        assert row["n"] == 10
        assert row["mean"][1] == pytest.approx(7.0 * float(t) + 2.0 * float(t) ** 3, abs=1e-9)


def test_the_posterior_given_the_score_is_the_conjugate_one_for_a_linear_response(script, tmp_path):
    """A mean score linear in theta' (slope a) with a constant sd v, and the data's score at the
    simulations' mean at theta_M: the likelihood of theta is N(0; a (theta - theta_M), v), so with
    the standard-normal prior the posterior is normal with precision 1 + a^2 / v^2 and mean
    theta_M a^2 / v^2 over that. The grid spans theta_M +- 0.5, 3.5 posterior sds here, which
    truncates the sd by 0.3 %: 1 % is the tolerance."""
    rng = np.random.default_rng(1)
    path = tmp_path / "h.jsonl"
    _write(path, script, 12, slope=7.0, cubic=0.0, warm_offset=0.0, rng=rng, theta=(0.0, 0.3))
    out = tmp_path / "h.json"
    script.main(["--report", str(path), "--json", str(out)])
    r = json.loads(out.read_text())
    v = np.sqrt(r["J"][1][1])
    prec = 1 + 49.0 / v**2
    post = r["score_posterior"]["1"]
    assert post["sd"] == pytest.approx(prec**-0.5, rel=0.01)
    assert post["mean"] == pytest.approx(0.3 * (49.0 / v**2) / prec, abs=0.01 * prec**-0.5)


def test_fitting_needs_the_mock_theta_and_out(script):
    with pytest.raises(SystemExit):
        script.main(["--theta", "0", "0"])
