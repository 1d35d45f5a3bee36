"""scripts/studies/muse_vs_chains.py: issue 21's "agrees with the posterior" check, read from the files
fli-map and fli-diagnose write. The expected numbers are worked by hand from the inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("studies/muse_vs_chains")


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


def _ar1(rng, n_chains, n_draws, rho, mean=0.8, sd=0.1):
    """Chains of an AR(1) process with stationary N(mean, sd^2) and autocorrelation ``rho``."""
    x = np.empty((n_chains, n_draws))
    x[:, 0] = rng.standard_normal(n_chains)
    for t in range(1, n_draws):
        x[:, t] = rho * x[:, t - 1] + np.sqrt(1 - rho ** 2) * rng.standard_normal(n_chains)
    return mean + sd * x


def _summary(x):
    """A diagnostics.json's per-parameter block from draws ``[chain, draw]``, by ArviZ."""
    import arviz as az

    d = az.convert_to_dataset(x)  # one variable, "x"
    v = lambda f, **kw: float(f(d, **kw)["x"])
    return {"mean": float(x.mean()), "sd": float(x.std(ddof=1)), "mcse_mean": v(az.mcse, method="mean"),
            "mcse_sd": v(az.mcse, method="sd"), "ess_bulk": v(az.ess, method="bulk"),
            "ess_tail": v(az.ess, method="tail"), "rhat": v(az.rhat)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_independent_runs_read_as_one_agree_with_arviz_over_all_their_draws(script, seed):
    """Two runs of 4 chains (AR(1) draws, autocorrelation 0.95: ESS about 1/40 of the draws)
    combined from their own summaries, against ArviZ's summary of all 8 chains at once, the
    independent reference. Over seeds 0-5 the combined mean lay within 0.08 of ArviZ's MCSE of
    the mean from ArviZ's mean, the sd within 0.11 of its MCSE, both MCSEs and the summed bulk ESS
    within 4 % of ArviZ's (the weights, 1/mcse^2, carry their estimates' noise); the bounds are
    2-3 times those."""
    rng = np.random.default_rng(seed)
    a, b = _ar1(rng, 4, 3000, 0.95), _ar1(rng, 4, 3000, 0.95)
    names = ("Omega_c", "sigma8", "S8")
    diag = lambda x: {"params": {k: _summary(x) for k in names}, "chains": 4, "draws_per_chain": 3000,
                      "verdict": "pass", "efficiency": {"gradient_evals": 24000.0, "seconds": 50.0,
                                                        "params": {"S8": {"ess_bulk_per_1000_grads": 1.0}}}}
    got = script.combine([diag(a), diag(b)])
    ref = _summary(np.concatenate([a, b]))
    s8 = got["params"]["S8"]
    assert abs(s8["mean"] - ref["mean"]) < 0.2 * ref["mcse_mean"], (s8["mean"], ref["mean"], ref["mcse_mean"])
    assert abs(s8["sd"] - ref["sd"]) < 0.3 * ref["mcse_sd"], (s8["sd"], ref["sd"], ref["mcse_sd"])
    assert s8["mcse_mean"] == pytest.approx(ref["mcse_mean"], rel=0.1)
    assert s8["mcse_sd"] == pytest.approx(ref["mcse_sd"], rel=0.1)
    assert s8["ess_bulk"] == pytest.approx(_summary(a)["ess_bulk"] + _summary(b)["ess_bulk"])
    assert s8["ess_bulk"] == pytest.approx(ref["ess_bulk"], rel=0.1)
    assert got["chains"] == 8 and got["efficiency"]["gradient_evals"] == 48000.0
    assert got["efficiency"]["params"]["S8"]["ess_bulk_per_1000_grads"] == pytest.approx(1000 * s8["ess_bulk"] / 48000)
    assert script.combine([diag(a)])["params"]["S8"] == _summary(a)  # one run is itself


def test_an_earlier_comparison_and_new_runs_make_one_reference(script):
    """A comparison whose chains' files are gone, combined with a new run's diagnostics: worked by
    hand. Means 0.80 (MCSE 0.006) and 0.86 (MCSE 0.012): weights 4 to 1, mean 0.812, MCSE
    0.006 / sqrt(1.25)."""
    muse, diag = _inputs(0.82, 0.11)
    old = {"note": "", "muse_source": "a/map.json", "chains_source": "d/diagnostics.json",
           **script.compare(muse, diag)}
    new = json.loads(json.dumps(diag))
    for row in new["params"].values():
        row.update(mean=0.86, mcse_mean=0.012)
    got = script.combine([json.loads(json.dumps(old)), new])
    assert got["params"]["S8"]["mean"] == pytest.approx(0.812)
    assert got["params"]["S8"]["mcse_mean"] == pytest.approx(0.006 / np.sqrt(1.25))
    assert got["params"]["S8"]["sd"] == pytest.approx(0.10) and got["params"]["S8"]["ess_bulk"] == 300.0
    res = script.compare(muse, got)
    assert res["params"]["S8"]["offset"] == pytest.approx((0.82 - 0.812) / 0.10)
    assert res["chains_run"]["combined_from"] == 2 and res["chains_run"]["chains"] == 8
