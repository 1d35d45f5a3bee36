"""scripts/studies/muse_j_noise.py: the width bias that N simulations give MUSE's covariance, checked
against the closed form for one parameter."""

from __future__ import annotations

import json
import math

import pytest

from tests.helpers.scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("studies/muse_j_noise")


@pytest.mark.parametrize("n", [8, 16])
def test_one_parameter_without_the_prior_is_c4(script, n):
    """With one parameter, H exact and the likelihood dominating the prior (H = 1000, J = 1), the
    sd is sqrt(J_hat) / H, and sqrt of a sample variance of n normals has mean c4(n) times the
    true sd: sqrt(2 / (n - 1)) Gamma(n / 2) / Gamma((n - 1) / 2)."""
    c4 = math.sqrt(2 / (n - 1)) * math.exp(math.lgamma(n / 2) - math.lgamma((n - 1) / 2))
    got = script.width_bias([[1000.0]], [[0.0]], [[1.0]], n, draws=20000)[0]
    # the ratio's sd over draws is about 1 / sqrt(2 (n - 1)) <= 0.27, so its mean over 20000
    # draws has an se below 0.002: 0.006 is 3 se
    assert got == pytest.approx(c4, abs=0.006)
    assert got < 1 - 0.5 * (1 - c4)  # and measurably below 1: the bias the script exists to show


def test_h_noise_widens_on_average(script):
    """A noisy H enters as H^-1, whose mean is larger than H's inverse (Jensen): with J's noise
    negligible (n = 2000) and H's se a fifth of H, the mean sd ratio lies above 1."""
    got = script.width_bias([[5.0]], [[1.0]], [[1.0]], 2000, draws=4000)[0]
    assert got > 1.02


def test_refuses_too_few_simulations_and_a_map_without_muse(script, tmp_path, capsys):
    good = tmp_path / "map.json"
    good.write_text(json.dumps({"muse": {"H": [[1.0, 0.0], [0.0, 2.0]], "H_se": [[0.1, 0.1], [0.1, 0.1]],
                                         "J": [[1.0, 0.0], [0.0, 1.0]], "cov_names": ["Omega_c", "sigma8"]}}))
    with pytest.raises(SystemExit, match="--n-sims 3: needs more than 3 simulations"):
        script.main([str(good), "--n-sims", "3"])
    bad = tmp_path / "joint.json"
    bad.write_text(json.dumps({"params": {}}))
    with pytest.raises(SystemExit, match="joint.json: not a MUSE run's map.json"):
        script.main([str(bad)])
    assert script.main([str(good), "--n-sims", "8", "--draws", "200"]) == 0
    assert "N =   8: mean sd ratio" in capsys.readouterr().out
