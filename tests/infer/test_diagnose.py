"""fli-diagnose on synthetic chains with known defects (no simulation), on bad input, and on a
real fli-nuts chain of the small mock (slow).

The synthetic chains are written in fli-nuts's on-disk format (config.yaml, chunks/chunk_<i>/
{draws,stats,spectra}.npz and DONE) by :func:`write_chain`: iid Gaussian parameters, iid
energies, tree depths below the maximum and no divergences make a healthy chain; each test
breaks one of these.
"""

import json
import math
import shutil
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import yaml

from fli.config import DiagnoseConfig
from fli.infer import diagnose as dg
from fli.infer import diagnose_runs as dg_runs
from fli.infer import diagnose_figures as dg_figures
from fli.infer.diagnose_convergence import harmonic_mean

N_K = 6
VCELL = 2.0  # (Mpc/h)^3, the prior expectation of the white noise's P(k)


@pytest.fixture(scope="module")
def config():
    from fli.cli.common import compose
    from tests.helpers.posterior import SMALL

    _, resolved = compose([*SMALL, "inference.num_warmup=10"])
    return resolved


def healthy(n=1000, seed=0, warmup=10):
    """Arrays of one healthy chain of ``warmup + n`` draws (warm-up first)."""
    rng = np.random.default_rng(seed)
    m = warmup + n
    oc = 0.26 + 0.02 * rng.standard_normal(m)
    s8 = 0.80 + 0.03 * rng.standard_normal(m)
    om = oc + 0.049
    depth = rng.integers(2, 5, m)  # max_tree_depth of the config is 6
    n_steps = 2 ** depth - 1
    draws = {"draw": np.arange(m), "warmup": np.arange(m) < warmup, "Omega_c": oc, "sigma8": s8, "Omega_m": om,
             "S8": s8 * np.sqrt(om / 0.3)}
    stats = {"diverging": np.zeros(m, bool), "energy": 1000 + 20 * rng.standard_normal(m),
             "potential_energy": 1000 + 10 * rng.standard_normal(m), "tree_depth": depth, "n_steps": n_steps,
             "step_size": np.full(m, 0.1), "acceptance_rate": rng.uniform(0.6, 1.0, m),
             "mean_accept_prob": rng.uniform(0.6, 1.0, m), "turning": np.ones(m),  # every tree ended by a U-turn
             "gradient_evals": 1 + np.cumsum(n_steps),
             "seconds": 0.01 * np.arange(1, m + 1)}
    spectra = {"k": 0.02 * np.arange(1, N_K + 1), "pk_white_noise": VCELL * (1 + 0.1 * rng.standard_normal((m, N_K))),
               "pk_linear": 100 + rng.random((m, N_K))}
    return draws, stats, spectra


def write_chain(run, config, arrays, chunk=250, seed=None):
    """Write ``arrays`` (draws, stats, spectra) as fli-nuts chunks of ``chunk`` draws into ``run``."""
    draws, stats, spectra = arrays
    run.mkdir(parents=True)
    cfg = {**config, "run_dir": str(run), "seed": seed if seed is not None else config["seed"]}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    m = draws["draw"].size
    for i, a in enumerate(range(0, m, chunk)):
        d = run / "chunks" / f"chunk_{i:05d}"
        d.mkdir(parents=True)
        sl = slice(a, min(a + chunk, m))
        np.savez(d / "draws.npz", **{k: v[sl] for k, v in draws.items()})
        np.savez(d / "stats.npz", draw=draws["draw"][sl], **{k: v[sl] for k, v in stats.items()})
        np.savez(d / "spectra.npz", draw=draws["draw"][sl], k=spectra["k"],
                 **{k: v[sl] for k, v in spectra.items() if k != "k"})
        (d / "DONE").write_text(json.dumps({"chunk": i}))
    return run


def four(tmp_path, config, change=None, n=1000):
    """Four healthy chains, chain 0 passed through ``change`` first."""
    runs = []
    for j in range(4):
        a = healthy(n=n, seed=j)
        if j == 0 and change is not None:
            change(*a)
        runs.append(write_chain(tmp_path / f"c{j}", config, a, seed=j))
    return runs


def verdicts(runs):
    chains, dropped = dg_runs.load(runs)
    report, idata = dg.diagnose_chains(chains, DiagnoseConfig())
    return {c["check"]: c["verdict"] for c in report["checks"]}, report, idata, dropped


def test_a_chain_keeps_its_warm_up_draws_for_the_warm_up_trace(tmp_path, config):
    """trace.png shows post-warm-up draws only, so a chain that fell to a prior's edge in its
    warm-up and stayed there showed flat lines with no history: the chain keeps its warm-up
    draws, in order, for warmup_trace.png."""
    from fli.infer.diagnose_figures import warmup_trace

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


def _shifted(draws, stats, spectra):
    draws["sigma8"][:] += 0.09  # 3 posterior sd
    om = draws["Omega_m"]
    draws["S8"][:] = draws["sigma8"] * np.sqrt(om / 0.3)


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
    (_shifted, {"rhat"}),
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
    from fli.infer.diagnose_convergence import constant

    rng = np.random.default_rng(0)
    fixed = np.float32(0.199) + np.float32(3e-8) * rng.integers(-1, 2, 500)  # the GPU run's Omega_m: sd 3e-8
    assert constant(fixed.astype(np.float32)) and constant(np.full(500, 0.15))
    assert not constant(0.26 + 1e-5 * rng.standard_normal(500))  # a chain that moves, however slowly
    assert not constant(np.array([0.0, 1e-3])) and constant(np.zeros(3))


def test_the_truth_comes_only_from_the_observation_the_chains_sampled(tmp_path):
    from fli.config import ConfigError
    from fli.infer.diagnose_fields import truth_of
    from fli.io import load_observation
    from tests.io.test_observation import mock_group

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
    _main([f"runs=[{','.join(map(str, runs))}]", f"run_dir={out}"])
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
    from fli.infer.run_store import read_chunks

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

    from fli.infer.diagnose_fields import prior_s8

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
        _main([f"runs=[{','.join(map(str, runs))}]", f"run_dir={out}"])
    rep = json.loads((out / "diagnostics.json").read_text())
    assert not (out / "energy.png").exists() and "energy_error" in rep["figures"]
    assert any(n.startswith("energy: not drawn (MCLMC") for n in rep["figure_notes"])
    assert seen["err"].shape == (4, 300) and np.isfinite(seen["err"]).all()
    assert seen["target"] == 5e-6 and seen["band"] == DiagnoseConfig().energy_error_ratio_pass * 5e-6  # 3x the target
    img = matplotlib.image.imread(out / "energy_error.png")
    assert img.std() > 0.05  # not a blank frame: the traces and histograms are drawn


def test_bands_are_the_issue_table():
    d = DiagnoseConfig()
    assert dg._band(1.009, lambda x: x < d.rhat_pass, lambda x: x < d.rhat_warn) == "pass"
    assert dg._band(1.03, lambda x: x < d.rhat_pass, lambda x: x < d.rhat_warn) == "warn"
    assert dg._band(1.05, lambda x: x < d.rhat_pass, lambda x: x < d.rhat_warn) == "fail"
    assert dg._band(None, lambda x: True, lambda x: True) == "fail"  # NaN (e.g. a constant chain) fails
    items = [{"verdict": "pass"}, {"verdict": "warn"}, {"verdict": "n/a"}]
    assert dg.overall(items) == "warn" and dg.overall(items + [{"verdict": "fail"}]) == "fail"


def test_unequal_lengths_use_the_common_length_and_say_so(tmp_path, config):
    runs = [write_chain(tmp_path / f"c{j}", config, healthy(n=n, seed=j), seed=j) for j, n in enumerate((500, 300))]
    chains, _ = dg_runs.load(runs)
    report, idata = dg.diagnose_chains(chains, DiagnoseConfig())
    assert idata.posterior.sizes["draw"] == 300 and report["draws_per_chain"] == 300
    table = dg_runs.chain_table(chains, 300)
    assert "truncated to the shortest chain: 300 of its 500" in table[0]["notes"][0] and not table[1]["notes"]
    np.testing.assert_array_equal(idata.posterior["sigma8"].values[0], chains[0].draws["sigma8"][:300])


def test_an_inconsistent_chain_is_dropped_naming_the_key(tmp_path, config):
    runs = four(tmp_path, config)
    other = {**config, "lensing": {**config["lensing"], "n_planes": 2}}
    runs.append(write_chain(tmp_path / "other", other, healthy(seed=9)))
    chains, dropped = dg_runs.load(runs)
    assert len(chains) == 4 and len(dropped) == 1
    assert dropped[0]["run"].endswith("other") and "lensing.n_planes = 2" in dropped[0]["reason"]
    # a seed, a run directory and draw counts may differ (they do here between c0..c3)
    assert dg_runs.model_key({**config, "seed": 5, "inference": {**config["inference"], "num_samples": 9}}) == \
        dg_runs.model_key(config)


def test_a_chunk_being_written_is_not_read(tmp_path, config):
    run = write_chain(tmp_path / "c0", config, healthy(n=190), chunk=100)  # chunks 0, 1 complete
    tmp = run / "chunks" / ".chunk_00002.tmp"
    tmp.mkdir()
    (tmp / "draws.npz").write_bytes(b"half a file")  # no DONE: being written
    c = dg_runs.read_chain(run)
    assert c.n_post == 190 and c.chunks == [0, 1]
    assert any(".chunk_00002.tmp" in n for n in c.notes)


def test_a_repeated_chain_or_one_of_another_observation_is_dropped(tmp_path, config):
    a = write_chain(tmp_path / "a", config, healthy(n=300, seed=1), seed=1)
    b = write_chain(tmp_path / "b", config, healthy(n=300, seed=2), seed=2)
    same_seed = write_chain(tmp_path / "same_seed", config, healthy(n=300, seed=3), seed=1)
    copy = tmp_path / "copy"
    shutil.copytree(b, copy)
    chains, dropped = dg_runs.load([a, b, same_seed, copy, a])
    assert [c.run for c in chains] == [a, b]
    why = {Path(d["run"]).name: d["reason"] for d in dropped}
    assert "repeats the chain of" in why["same_seed"] and "same seed (1)" in why["same_seed"]
    assert "identical draws" in why["copy"] and len(dropped) == 3  # a listed twice is dropped too
    # manifests recording another observation's fingerprint
    for run, fp in ((a, "a" * 64), (b, "b" * 64)):
        (run / "fli-run.json").write_text(json.dumps({"command": "fli-nuts",
                                                      "observation": {"path": "x", "fingerprint": fp}}))
    chains, dropped = dg_runs.load([a, b])
    assert len(chains) == 1 and "sampled another observation" in dropped[0]["reason"]
    assert "bbbbbbbbbbbbbbbb here, aaaaaaaaaaaaaaaa there" in dropped[0]["reason"]


def test_a_chain_still_in_warm_up_is_dropped(tmp_path, config):
    a = write_chain(tmp_path / "a", config, healthy(n=50))
    b = write_chain(tmp_path / "b", config, healthy(n=0, warmup=10), chunk=5)
    chains, dropped = dg_runs.load([a, b])
    assert len(chains) == 1 and "still in warm-up (10 of 10" in dropped[0]["reason"]


# ---------------------------------------------------------------- the command


def _main(args):
    from fli.cli.diagnose import main

    return main(args)


def test_command_writes_report_and_exit_status(tmp_path, config, capsys):
    """Healthy chains: status 0, diagnostics.json, chains.nc, figures and one HTML page."""
    runs = [write_chain(tmp_path / f"c{j}", config, healthy(n=500, seed=j), seed=j) for j in range(2)]
    out = tmp_path / "diag"
    assert _main([f"runs=[{','.join(map(str, runs))}]", f"run_dir={out}"]) == 0
    text = capsys.readouterr().out
    assert "verdict: PASS (exit status 0)" in text and len(text.splitlines()) < 40  # one screen
    rep = json.loads((out / "diagnostics.json").read_text())
    assert rep["verdict"] == "pass" and (out / "chains.nc").is_file()
    for name in ("trace", "warmup_trace", "rank", "pair", "energy", "s8_prior", "field_pk"):
        assert (out / f"{name}.png").is_file(), rep["figure_notes"]
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(rep["figures"]) and "src=\"http" not in page


def test_command_fail_is_status_4_with_report(tmp_path, config, capsys):
    runs = four(tmp_path, config, _shifted)
    out = tmp_path / "diag"
    assert _main([f"runs=[{','.join(map(str, runs))}]", f"run_dir={out}", "diagnose.figures=false"]) == 4
    assert "verdict: FAIL" in capsys.readouterr().out and (out / "diagnostics.json").is_file()


def test_command_sweep_directory(tmp_path, config):
    sweep = tmp_path / "multirun"
    for j in range(2):
        write_chain(sweep / str(j), config, healthy(n=600, seed=j), seed=j)
    (sweep / "multirun.yaml").write_text("{}")
    out = tmp_path / "diag"
    code = _main([f"sweep={sweep}", f"run_dir={out}", "diagnose.figures=false"])
    rep = json.loads((out / "diagnostics.json").read_text())
    assert code == rep["exit_status"] and rep["chains"] == 2 and [r["run"][-1] for r in rep["runs"]] == ["0", "1"]


@pytest.mark.parametrize("args, match", [
    ([], "give the chains to diagnose"),
    (["runs=[{empty}]"], "no complete chunk yet"),
    (["runs=[{mock}]"], "is a fli-mock run, not a sampling run"),
    (["runs=[{missing}]"], "is not a directory"),
    (["sweep={empty}"], "holds no fli-sample or fli-nuts job directory"),
    (["runs=[{empty}]", "sweep={empty}"], "not both"),
    (["diagnose.rhat_pass=0.9"], "diagnose.rhat_pass"),
])
def test_bad_input_is_one_line_status_2_and_no_report(tmp_path, capsys, args, match):
    empty = tmp_path / "empty"
    (empty / "chunks").mkdir(parents=True)
    (empty / "config.yaml").write_text("seed: 0\n")
    out = tmp_path / "diag"
    mock = tmp_path / "mock"
    (mock / "mock.zarr").mkdir(parents=True)
    args = [a.format(empty=empty, missing=tmp_path / "missing", mock=mock) for a in args]
    assert _main([*args, f"run_dir={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fli-diagnose: error:") and match in err[0], err
    assert not (out / "diagnostics.json").exists()


def test_harmonic_mean():
    assert harmonic_mean([1.0, 4.0, 4.0]) == pytest.approx(2.0)
    assert harmonic_mean([1.0, math.nan]) is None


# ---------------------------------------------------------------- a real chain


@pytest.mark.slow(seconds=35)  # a second short chain beside the session's (tests/infer/conftest.py), and the report
def test_real_chains_of_the_small_mock(small_mock, chain, tmp_path):
    """Two fli-nuts chains of the small mock (the session's chain, seed 3, and one of seed 0),
    diagnosed: the report's numbers are ArviZ's on chains.nc, its draws are the runs'
    posterior.nc draws, every figure is drawn."""
    import arviz as az

    from fli.cli.nuts import main as nuts_main
    from tests.helpers.posterior import CHAIN, SMALL

    runs = [chain, tmp_path / "nuts0"]
    assert nuts_main([*SMALL, *CHAIN, "seed=0", f"mock={small_mock}", f"run_dir={runs[1]}"]) == 0
    out = tmp_path / "diag"
    code = _main([f"runs=[{runs[0]},{runs[1]}]", f"run_dir={out}"])
    rep = json.loads((out / "diagnostics.json").read_text())
    assert code == rep["exit_status"] == 4  # 6 draws per chain: far too short, and the report says so
    assert rep["draws_per_chain"] == 6 and rep["chains"] == 2
    idata = az.from_netcdf(out / "chains.nc")
    for j, run in enumerate(runs):
        own = az.from_netcdf(run / "posterior.nc")
        np.testing.assert_array_equal(idata.posterior["S8"].values[j], own.posterior["S8"].values[0])
    for k in ("Omega_c", "sigma8", "Omega_m", "S8"):
        assert rep["params"][k]["rhat"] == pytest.approx(float(az.rhat(idata, var_names=[k])[k]), rel=1e-12)
        assert rep["params"][k]["ess_tail"] == pytest.approx(float(az.ess(idata, var_names=[k], method="tail")[k]),
                                                             rel=1e-12)
    assert [p["ebfmi"] for p in rep["sampler"]["per_chain"]] == pytest.approx(az.bfmi(idata).tolist(), rel=1e-12)
    # max_tree_depth=3 in CHAIN: the saturation is read against the run's own config
    assert all(p["max_tree_depth"] == 3 for p in rep["sampler"]["per_chain"])
    for name in ("trace", "rank", "pair", "energy", "s8_prior", "field_pk", "field_slices", "mass_maps", "r_k",
                 "residuals"):
        assert (out / f"{name}.png").is_file(), (name, rep["figure_notes"])


# ---------------------------------------------------------------- the page in a real browser


def _chromium():
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="headless Chromium not installed (Debian package chromium; "
                                                 ".ci/run installs it)")
@pytest.mark.slow(seconds=10)  # two Chromium starts and the figures
def test_report_renders_in_headless_chromium(tmp_path, config):
    """report.html opened by Chromium: it renders (a screenshot with the figures' colours), every
    image decodes (naturalWidth > 0, read by a script added to a copy), and it names no resource
    outside itself."""
    import re
    import subprocess

    runs = [write_chain(tmp_path / f"c{j}", config, healthy(n=300, seed=j), seed=j) for j in range(2)]
    out = tmp_path / "diag"
    assert _main([f"runs=[{runs[0]},{runs[1]}]", f"run_dir={out}"]) in (0, 1, 2)
    page = out / "report.html"
    text = page.read_text()
    n_fig = len(json.loads((out / "diagnostics.json").read_text())["figures"])
    assert n_fig >= 6
    refs = re.findall(r'(?:src|href)="([^"]*)"', text)
    assert refs and all(r.startswith("data:image/png;base64,") for r in refs), [r[:40] for r in refs]
    base = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    shot = tmp_path / "shot.png"
    r = subprocess.run([*base, f"--screenshot={shot}", "--window-size=1200,3000", page.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert shot.is_file(), r.stderr[-2000:]
    import matplotlib.image as mi

    img = mi.imread(shot)
    assert img.shape[0] >= 2000 and img.shape[1] >= 1000
    rgb = img[..., :3]
    coloured = np.mean((rgb.max(-1) - rgb.min(-1)) > 0.2)  # not grey: badges, plot lines, colour maps
    assert coloured > 0.01, coloured
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", "<script>window.addEventListener('load', () => {document.title = "
                                  "'decoded:' + Array.from(document.images).map(i => i.complete && i.naturalWidth > 0"
                                  " ? 1 : 0).join('');});</script></body>"))
    r = subprocess.run([*base, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    title = re.search(r"<title>(.*?)</title>", r.stdout)
    assert title and title.group(1) == "decoded:" + "1" * n_fig, (title and title.group(1), r.stderr[-2000:])
