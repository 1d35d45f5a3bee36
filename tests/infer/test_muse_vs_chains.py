"""scripts/muse_vs_chains.py: issue 21's "agrees with the posterior" check, read from the files
fli-map and fli-diagnose write. The expected numbers are worked by hand from the inputs."""

from __future__ import annotations

import json

import pytest

from tests.helpers.scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("muse_vs_chains")


def _inputs(s8_value: float, s8_sd: float):
    names = ("Omega_c", "sigma8", "S8")
    muse = {"truth": {"Omega_c": 0.26, "sigma8": 0.81, "S8": 0.82},
            "muse": {"params": {"Omega_c": 0.25, "sigma8": 0.80, "S8": s8_value},
                     "sd": {"Omega_c": 0.05, "sigma8": 0.06, "S8": s8_sd},
                     "mc_sd": {k: 0.0 for k in names}, "grad_evals": 1000, "seconds": 10.0, "converged": True}}
    chain = {"mean": 0.80, "sd": 0.10, "mcse_mean": 0.006, "mcse_sd": 0.005, "ess_bulk": 150.0,
             "ess_tail": 160.0, "rhat": 1.01}
    diag = {"params": {k: dict(chain) for k in names}, "chains": 4, "draws_per_chain": 2000, "verdict": "warn",
            "efficiency": {"gradient_evals": 32000.0, "seconds": 100.0,
                           "params": {"S8": {"ess_bulk_per_1000_grads": 5.0}}}}
    return muse, diag


def test_offset_ratio_and_verdict(script):
    # S8: MUSE 0.82 +- 0.11 against the chains' 0.80 +- 0.10: offset 0.2 sd, ratio 1.1 -> passes
    res = script.compare(*_inputs(0.82, 0.11))
    s8 = res["params"]["S8"]
    assert s8["offset"] == pytest.approx(0.2)
    assert s8["sd_ratio"] == pytest.approx(1.1)
    assert s8["offset_mc_err"] == pytest.approx(0.06)  # mcse_mean / sd, MUSE's mc_sd is 0 here
    assert s8["sd_ratio_mc_err"] == pytest.approx(1.1 * 0.05)
    assert s8["muse_pull"] == pytest.approx(0.0)
    assert res["criterion"]["pass"]
    assert res["chains_run"]["post_warmup_grads_to_ess_400"] == pytest.approx(80000.0)


def test_an_earlier_comparison_stands_in_for_the_chains_files(script):
    """Its chains' summaries and run, read back, give the comparison the diagnostics gave: the
    chains' files may be gone (another machine) when MUSE is run again."""
    muse, diag = _inputs(0.82, 0.11)
    first = {"note": "", "muse_source": "a/map.json", "chains_source": "d/diagnostics.json",
             **script.compare(muse, diag)}
    muse["muse"]["params"]["S8"] = 0.85  # a new MUSE run: offset 0.5 sd against the same chains
    again = script.compare(muse, json.loads(json.dumps(first)))
    assert again["params"]["S8"]["offset"] == pytest.approx(0.5) and not again["criterion"]["offset_ok"]
    assert again["params"]["S8"]["chains"] == first["params"]["S8"]["chains"]
    assert again["chains_run"] == first["chains_run"]


@pytest.mark.parametrize("value, sd, which", [(0.84, 0.10, "offset_ok"), (0.80, 0.13, "sd_ratio_ok"),
                                              (0.80, 0.07, "sd_ratio_ok")])
def test_each_bound_can_fail(script, value, sd, which):
    # offset 0.4 sd, or a ratio of 1.3 or 0.7: each breaks one of the two bounds
    res = script.compare(*_inputs(value, sd))
    assert not res["criterion"][which]
    assert not res["criterion"]["pass"]


def test_refuses_a_map_without_muse(script, tmp_path):
    muse, diag = _inputs(0.8, 0.1)
    (tmp_path / "map.json").write_text(json.dumps({"params": {}}))
    (tmp_path / "diagnostics.json").write_text(json.dumps(diag))
    with pytest.raises(SystemExit, match="no 'muse' block"):
        script.main(["--muse", str(tmp_path / "map.json"), "--chains", str(tmp_path / "diagnostics.json")])
