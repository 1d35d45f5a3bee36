"""fli-diagnose's checks on synthetic chains with known defects (no simulation): each check
passes healthy chains and fails the defect it is for. The chains are tests/helpers/chains.py's;
the command, the runs it reads and a real chain are tests/infer/diagnose/test_diagnose_command.py's.
"""

import json
import math
from unittest import mock

import numpy as np
import pytest

from fli.config import DiagnoseConfig
from fli.infer.diagnose import checks as dg_checks
from fli.infer.diagnose import run as dg
from fli.infer.diagnose import figures as dg_figures
from fli.infer.diagnose import chains as dg_runs
from fli.infer.diagnose.convergence import harmonic_mean
from tests.helpers.chains import diagnose_main, four, healthy, shifted, small_config, write_chain


@pytest.fixture(scope="module")
def config():
    return small_config()


def verdicts(runs):
    chains, dropped = dg_runs.load(runs)
    report, idata = dg.diagnose_chains(chains, DiagnoseConfig())
    return {c["check"]: c["verdict"] for c in report["checks"]}, report, idata, dropped


def test_a_chain_keeps_its_warm_up_draws_for_the_warm_up_trace(tmp_path, config):
    """trace.png shows post-warm-up draws only, so a chain that fell to a prior's edge in its
    warm-up and stayed there showed flat lines with no history: the chain keeps its warm-up
    draws, in order, for warmup_trace.png."""
    from fli.infer.diagnose.figures import warmup_trace

    arrays = healthy(n=40, seed=0, warmup=10)
    chain = dg_runs.read_chain(write_chain(tmp_path / "c", config, arrays, chunk=20))
    assert chain.n_warmup == 10 and chain.draws["sigma8"].size == 40
    np.testing.assert_array_equal(chain.warmup_draws["sigma8"], arrays[0]["sigma8"][:10])
    np.testing.assert_array_equal(chain.warmup_draws["draw"], np.arange(10))
    assert warmup_trace([chain], ["Omega_c", "sigma8"], tmp_path / "w.png").is_file()


def test_healthy_chains_pass_every_check(tmp_path, config):
    v, report, _, dropped = verdicts(four(tmp_path, config))
    assert set(v.values()) == {"pass"}, v
    assert report["verdict"] == "pass" and report["exit_status"] == 0 and not dropped
    assert report["draws_per_chain"] == 1000 and report["chains"] == 4
    # iid draws: ESS about the 4000 draws (ArviZ's estimate scatters by ~10%), R-hat near 1
    for p in report["params"].values():
        assert 3000 < p["ess_bulk"] < 5500 and abs(p["rhat"] - 1) < 0.01
    e = report["efficiency"]
    # gradient evaluations of the post-warm-up draws: the cumulative counter's increase, summed
    assert e["gradient_evals"] > 4 * 1000 * 3 and e["seconds"] == pytest.approx(4 * 1000 * 0.01)


def test_vectorised_chains_count_their_runs_time_once(tmp_path, config):
    """Each chain of a run of vectorised chains (``chain_<c>/``) records the run's whole time:
    summed as four chain-hours they made ESS per hour 4x too low. Separate runs still add."""
    runs = []
    for j in range(4):  # two runs of two vectorised chains: each pair shares its seconds
        a = healthy(n=500, seed=j)
        a[1]["seconds"] = (1.0 + j // 2) * np.arange(1, 511)
        runs.append(write_chain(tmp_path / f"run{j // 2}" / f"chain_{j % 2}", config, a, seed=j))
    _, report, _, _ = verdicts(runs)
    # post-warm-up: seconds[509] - seconds[9] = 500 (run 0) and 1000 (run 1), once each
    assert report["efficiency"]["seconds"] == pytest.approx(500.0 + 1000.0)


def test_the_numbers_are_arviz_own(tmp_path, config):
    import arviz as az

    _, report, idata, _ = verdicts(four(tmp_path, config))
    names = ["Omega_c", "sigma8", "Omega_m", "S8"]
    for k in names:
        assert report["params"][k]["rhat"] == float(az.rhat(idata, var_names=[k], method="rank")[k])
        assert report["params"][k]["ess_bulk"] == float(az.ess(idata, var_names=[k], method="bulk")[k])
        assert report["params"][k]["ess_tail"] == float(az.ess(idata, var_names=[k], method="tail")[k])
        assert report["params"][k]["mcse_mean"] == float(az.mcse(idata, var_names=[k], method="mean")[k])
    assert [p["ebfmi"] for p in report["sampler"]["per_chain"]] == [float(x) for x in az.bfmi(idata)]
    ess_k = np.asarray(az.ess(idata.field_summaries[["pk_white_noise"]], method="bulk")["pk_white_noise"])
    assert report["field"]["ess_bulk"] == ess_k.tolist() and report["field"]["ess_bulk_min"] == ess_k.min()
    assert report["field"]["ess_bulk_harmonic_mean"] == pytest.approx(len(ess_k) / np.sum(1 / ess_k), rel=1e-12)


def _stuck(draws, stats, spectra):
    for k in ("Omega_c", "sigma8", "Omega_m", "S8"):
        draws[k][10:] = draws[k][10]
    spectra["pk_white_noise"][10:] = spectra["pk_white_noise"][10]


def _divergent(draws, stats, spectra):
    stats["diverging"][10::100] = True  # 1% of one chain: 0.25% of all draws


def _low_bfmi(draws, stats, spectra):
    rng = np.random.default_rng(5)
    e = np.zeros(draws["draw"].size)
    for i in range(1, e.size):  # AR(1), rho 0.98: E-BFMI ~ 2 (1 - rho) = 0.04
        e[i] = 0.98 * e[i - 1] + rng.standard_normal()
    stats["energy"][:] = 1000 + 20 * e


def _saturated(draws, stats, spectra):
    stats["tree_depth"][10::3] = 6  # a third of the draws at max_tree_depth, ended there by the cap
    stats["turning"][10::3] = 0.0


@pytest.mark.parametrize("change, flagged", [
    (_stuck, {"rhat", "ess_bulk", "stuck", "field_rhat"}),
    (shifted, {"rhat"}),
    (_divergent, {"divergences"}),
    (_low_bfmi, {"ebfmi"}),
    (_saturated, {"tree_depth"}),
], ids=["stuck", "shifted", "divergences", "low-ebfmi", "tree-depth"])
def test_each_defect_is_flagged(tmp_path, config, change, flagged):
    v, report, _, _ = verdicts(four(tmp_path, config, change))
    for c in flagged:
        assert v[c] == "fail", (c, v)
    assert report["verdict"] == "fail" and report["exit_status"] == 4
    healthy_checks = {"divergences", "ebfmi", "tree_depth"} - flagged
    assert all(v[c] == "pass" for c in healthy_checks), v


def test_chains_parked_at_one_point_fail_as_stuck_not_as_copies_or_as_mixed(tmp_path, config):
    # two chains parked at the prior's lower edges, as MCLMC started from the prior did on the
    # default size (docs/benchmarks.md): ArviZ gives a constant chain an ESS of its length, which
    # passed, and the second chain was dropped as a copy of the first
    runs = []
    for j in range(2):
        a = healthy(n=500, seed=j)
        for k, v in (("Omega_c", 0.15), ("sigma8", 0.5), ("Omega_m", 0.199), ("S8", 0.5 * np.sqrt(0.199 / 0.3))):
            a[0][k][10:] = v
        runs.append(write_chain(tmp_path / f"c{j}", config, a, seed=j))
    v, report, _, dropped = verdicts(runs)
    assert not dropped and report["chains"] == 2
    assert v["stuck"] == v["ess_bulk"] == v["ess_tail"] == v["rhat"] == "fail"
    assert all(p["ess_bulk"] is None and p["ess_tail"] is None and p["rhat"] is None for p in report["params"].values())
    stuck = next(c for c in report["checks"] if c["check"] == "stuck")
    assert stuck["value"] == 8 and "sigma8 = 0.5 in chain 1 (500 draws)" in stuck["where"]


def test_constant_allows_float32_rounding_of_a_derived_parameter_only():
    from fli.infer.diagnose.convergence import constant

    rng = np.random.default_rng(0)
    fixed = np.float32(0.199) + np.float32(3e-8) * rng.integers(-1, 2, 500)  # the GPU run's Omega_m: sd 3e-8
    assert constant(fixed.astype(np.float32)) and constant(np.full(500, 0.15))
    assert not constant(0.26 + 1e-5 * rng.standard_normal(500))  # a chain that moves, however slowly
    assert not constant(np.array([0.0, 1e-3])) and constant(np.zeros(3))


def test_the_truth_comes_only_from_the_observation_the_chains_sampled(tmp_path):
    from fli.config import ConfigError
    from fli.infer.diagnose.fields import truth_of
    from fli.store.io import load_observation
    from tests.store.test_observation import mock_group

    mock_group(tmp_path / "a" / "mock.zarr")
    mock_group(tmp_path / "b" / "mock.zarr", white_noise=np.zeros((8, 8, 16), np.float32))  # another observation
    fp = load_observation(tmp_path / "a").fingerprint
    recorded = {"path": str(tmp_path / "a" / "mock.zarr"), "fingerprint": fp}
    notes = []
    assert truth_of({"mock": str(tmp_path / "a")}, notes, recorded).fingerprint == fp and not notes
    # the run's mock path now holds another observation (a path reused, or a run moved between
    # machines): no truth, and a note that says why and what to give
    assert truth_of({"mock": str(tmp_path / "b")}, notes, recorded) is None
    assert "is not the observation the chains sampled" in notes[0] and "mock=<that observation>" in notes[0]
    # the user's mock= replaces the run's path, checked the same way; a wrong one is refused
    assert truth_of({"mock": "/moved/away"}, [], recorded, mock=str(tmp_path / "a")).fingerprint == fp
    with pytest.raises(ConfigError, match="name the mock the run was made with"):
        truth_of({"mock": str(tmp_path / "a")}, [], recorded, mock=str(tmp_path / "b"))
    with pytest.raises(ConfigError, match="not a readable observation"):
        truth_of({}, [], recorded, mock=str(tmp_path / "nothing"))


def test_trees_that_u_turned_at_the_last_doubling_are_not_the_cap(tmp_path, config):
    """A third of chain 0's draws reach max_tree_depth, but a U-turn ended each (``turning``
    1): the trajectories were long enough, the check passes and says how many there were. The
    same draws with no record of why (a run made before ``turning``) count as the cap."""
    def long_trees(draws, stats, spectra):
        stats["tree_depth"][10::3] = 6

    v, report, _, _ = verdicts(four(tmp_path / "uturn", config, long_trees))
    assert v["tree_depth"] == "pass", v
    chain0 = report["sampler"]["per_chain"][0]
    assert chain0["tree_depth_saturation"] == 0.0 and abs(chain0["max_depth_uturn"] - 1 / 3) < 0.01
    check = next(c for c in report["checks"] if c["check"] == "tree_depth")
    assert "33.3%" in check["what"] or "33.4%" in check["what"], check

    def unrecorded(draws, stats, spectra):
        long_trees(draws, stats, spectra)
        stats["turning"][:] = np.nan

    v, report, _, _ = verdicts(four(tmp_path / "old", config, unrecorded))
    assert v["tree_depth"] == "fail", v
    assert abs(report["sampler"]["per_chain"][0]["max_depth_unrecorded"] - 1 / 3) < 0.01


def test_a_data_constrained_projection_that_did_not_mix_fails_where_p_k_passes(tmp_path, config):
    """Chains that record the field's data-constrained projections (spectra.npz's
    ``projections``): independent unit normals in every chain pass; chain 0's projection 2 held
    3 sds off the others' (a mode it never left, which the white noise's P(k) does not see)
    fails projection_rhat, while the parameters and P(k) still pass."""
    runs = []
    for j in range(4):
        a = _with_normal_projections(healthy(seed=j), 100 + j)
        if j == 0:
            a[2]["projections"][:, 2] += 3.0
        runs.append(write_chain(tmp_path / f"c{j}", config, a, seed=j))
    v, report, idata, _ = verdicts(runs)
    assert report["projections"]["count"] == 5 and idata.field_summaries["projections"].shape == (4, 1000, 5)
    assert v["projection_rhat"] == "fail" and report["projections"]["rhat_argmax"] == 2, report["projections"]
    assert all(v[c] == "pass" for c in ("rhat", "field_rhat", "ess_bulk")), v
    out = tmp_path / "diag"  # as a user runs it: the projections' traces are drawn, one panel pair each
    diagnose_main([f"runs=[{','.join(map(str, runs))}]", f"run_dir={out}"])
    rep = json.loads((out / "diagnostics.json").read_text())
    assert "projections" in rep["figures"] and rep["verdict"] == "fail"
    ok = [write_chain(tmp_path / f"ok{j}", config, _with_normal_projections(healthy(seed=j), 20 + j), seed=j)
          for j in range(4)]
    v, report, _, _ = verdicts(ok)
    assert v["projection_rhat"] == v["projection_ess_bulk"] == v["projection_ess_tail"] == "pass", v


def _with_normal_projections(arrays, seed):
    """``arrays`` with 5 independent unit-normal projections per draw."""
    draws, stats, spectra = arrays
    spectra["projections"] = np.random.default_rng(seed).standard_normal((draws["draw"].size, 5))
    return arrays


def test_a_statistic_that_older_chunks_lack_is_nan_there(tmp_path, config):
    """A run extended across the version that added ``turning``: its first chunks have none.
    read_chunks keeps every array aligned with the draws, NaN where the chunk had no record."""
    from fli.infer.sample.run_store import read_chunks

    run = write_chain(tmp_path / "c0", config, healthy(n=490), chunk=250)
    first = run / "chunks" / "chunk_00000" / "stats.npz"
    with np.load(first) as f:
        kept = {k: f[k] for k in f.files if k != "turning"}
    np.savez(first, **kept)
    st = read_chunks(run)["stats"]
    assert st["turning"].shape == st["tree_depth"].shape == (500,)
    assert np.isnan(st["turning"][:250]).all() and (st["turning"][250:] == 1).all()


def test_a_too_short_chain_is_flagged(tmp_path, config):
    v, report, _, _ = verdicts(four(tmp_path, config, n=20))
    assert v["ess_bulk"] == "fail" and v["ess_tail"] == "fail" and report["verdict"] == "fail"


def mclmc_runs(tmp_path, config, variance, kernel="mclmc", n=1000, target=5e-6):
    """Four healthy chains written as MCLMC's: no Hamiltonian energy (NaN in stats.npz), no
    tree, and a normal energy error of ``variance`` per dimension, tuned to ``target``
    (``inference.mclmc_energy_error``; None: a run made before the key)."""
    import copy

    cfg = copy.deepcopy(config)
    cfg["inference"]["kernel"] = kernel
    if target is None:
        cfg["inference"].pop("mclmc_energy_error", None)
    else:
        cfg["inference"]["mclmc_energy_error"] = target
    runs = []
    for j in range(4):
        draws, stats, spectra = healthy(n=n, seed=j)
        m = draws["draw"].size
        rng = np.random.default_rng(10 + j)
        stats.update(energy=np.full(m, np.nan), tree_depth=np.zeros(m, int), n_steps=np.full(m, 2),
                     gradient_evals=1 + 2 * np.arange(1, m + 1), energy_error=math.sqrt(variance) * rng.normal(size=m))
        runs.append(write_chain(tmp_path / f"c{j}", cfg, (draws, stats, spectra), seed=j))
    return runs


@pytest.mark.parametrize("variance, target, verdict", [
    (5e-6, 5e-6, "pass"), (2.5e-5, 5e-6, "warn"), (1e-4, 5e-6, "fail"),  # 1x, 5x, 20x the default target
    (1e-4, 1e-4, "pass"),  # the same errors pass where the run aimed at them
    (2.5e-3, None, "warn")])  # a run made before the key aimed at the old default, 5e-4
def test_mclmc_chains_are_judged_by_their_energy_error_not_ebfmi_or_tree_depth(tmp_path, config, variance, target,
                                                                               verdict):
    """MCLMC has no Hamiltonian energy (NaN in stats.npz) and no tree: E-BFMI and tree depth are
    n/a. The energy error's variance per dimension (the mean square of the stored energy_error,
    which is divided by sqrt(dim)) over the target the run's warm-up aimed at is checked against
    diagnose.energy_error_ratio_* (pass < 3x, warn < 10x): the bias grows with the error, and an
    error far over its target is a warm-up that missed (docs/benchmarks.md)."""
    v, report, _, _ = verdicts(mclmc_runs(tmp_path, config, variance, target=target))
    assert v["ebfmi"] == "n/a" and v["tree_depth"] == "n/a"
    assert v["energy_error"] == verdict, report["checks"]
    err = next(c for c in report["checks"] if c["check"] == "energy_error")
    aimed = 5e-4 if target is None else target
    assert err["value"] == pytest.approx(variance / aimed, rel=0.15)  # the mean square of 1000 draws: +-4.5 %
    per = report["sampler"]["per_chain"]
    assert all(p["energy_error_target"] == aimed for p in per)
    assert all(p["energy_error_var_per_dim"] == pytest.approx(variance, rel=0.15) for p in per)


def test_the_prior_of_a_run_saved_under_an_old_diagnose_key_is_still_drawn(config):
    """A chain saved while diagnose's energy-error bands were absolute holds
    diagnose.energy_error_pass, which the schema no longer has: s8_prior.png's prior draws
    dropped it (a user run lost the figure), since fli-diagnose's keys never shaped a run.
    The draws are the same, bit for bit, as those of the config without it."""
    import copy

    from fli.infer.diagnose.fields import prior_s8

    old = copy.deepcopy(config)
    old["diagnose"] = {"energy_error_pass": 1e-3, "energy_error_warn": 1e-2}
    now = copy.deepcopy(config)
    now.pop("diagnose", None)
    got = prior_s8(old, n=500)
    assert got.shape == (500,) and np.isfinite(got).all() and got.std() > 0
    np.testing.assert_array_equal(got, prior_s8(now, n=500))


def test_mclmc_chains_get_an_energy_error_figure_not_an_empty_energy_plot(tmp_path, config):
    """ArviZ's energy plot of MCLMC's all-NaN energies is an empty frame (a user run of the
    adjusted kernel drew one): MCLMC chains get their energy errors drawn instead, whose lines
    hold every stored error, and the report says why there is no energy plot. The unadjusted
    kernel's figure carries the pass band (one kernel here: the figures cost 8 s a run)."""
    import matplotlib.image

    runs = mclmc_runs(tmp_path, config, 5e-6, "mclmc", n=300)
    seen = {}
    real = dg_figures.energy_error
    with mock.patch.object(dg_figures, "energy_error", side_effect=lambda err, band, path, target: seen.update(
            err=err, band=band, target=target) or real(err, band, path, target)):
        out = tmp_path / "diag"
        diagnose_main([f"runs=[{','.join(map(str, runs))}]", f"run_dir={out}"])
    rep = json.loads((out / "diagnostics.json").read_text())
    assert not (out / "energy.png").exists() and "energy_error" in rep["figures"]
    assert any(n.startswith("energy: not drawn (MCLMC") for n in rep["figure_notes"])
    assert seen["err"].shape == (4, 300) and np.isfinite(seen["err"]).all()
    assert seen["target"] == 5e-6 and seen["band"] == DiagnoseConfig().energy_error_ratio_pass * 5e-6  # 3x the target
    img = matplotlib.image.imread(out / "energy_error.png")
    assert img.std() > 0.05  # not a blank frame: the traces and histograms are drawn


def test_bands_are_the_issue_table():
    d = DiagnoseConfig()
    assert dg_checks._band(1.009, lambda x: x < d.rhat_pass, lambda x: x < d.rhat_warn) == "pass"
    assert dg_checks._band(1.03, lambda x: x < d.rhat_pass, lambda x: x < d.rhat_warn) == "warn"
    assert dg_checks._band(1.05, lambda x: x < d.rhat_pass, lambda x: x < d.rhat_warn) == "fail"
    assert dg_checks._band(None, lambda x: True, lambda x: True) == "fail"  # NaN (e.g. a constant chain) fails
    items = [{"verdict": "pass"}, {"verdict": "warn"}, {"verdict": "n/a"}]
    assert dg_checks.overall(items) == "warn" and dg_checks.overall(items + [{"verdict": "fail"}]) == "fail"


def test_harmonic_mean():
    assert harmonic_mean([1.0, 4.0, 4.0]) == pytest.approx(2.0)
    assert harmonic_mean([1.0, math.nan]) is None
