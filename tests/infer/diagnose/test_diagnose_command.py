"""fli-diagnose as a command: the runs it reads and the ones it drops (fli.infer.diagnose.chains),
its report, exit status and one-line errors, a real fli-nuts chain of the small mock (slow), and
the report page in a real browser (slow). The synthetic chains are tests/helpers/chains.py's.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fli.config import DiagnoseConfig
from fli.infer.diagnose import run as dg
from fli.infer.diagnose import chains as dg_runs
from tests.helpers.chains import diagnose_main, four, healthy, shifted, small_config, write_chain


@pytest.fixture(scope="module")
def config():
    return small_config()


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


def test_command_writes_report_and_exit_status(tmp_path, config, capsys):
    """Healthy chains: status 0, diagnostics.json, chains.nc, figures and one HTML page."""
    runs = [write_chain(tmp_path / f"c{j}", config, healthy(n=500, seed=j), seed=j) for j in range(2)]
    out = tmp_path / "diag"
    assert diagnose_main([f"runs=[{','.join(map(str, runs))}]", f"run_dir={out}"]) == 0
    text = capsys.readouterr().out
    assert "verdict: PASS (exit status 0)" in text and len(text.splitlines()) < 40  # one screen
    rep = json.loads((out / "diagnostics.json").read_text())
    assert rep["verdict"] == "pass" and (out / "chains.nc").is_file()
    for name in ("trace", "warmup_trace", "rank", "corner", "energy", "s8_prior", "field_pk"):
        assert (out / f"{name}.png").is_file(), rep["figure_notes"]
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(rep["figures"]) and "src=\"http" not in page


def test_command_fail_is_status_4_with_report(tmp_path, config, capsys):
    runs = four(tmp_path, config, shifted)
    out = tmp_path / "diag"
    assert diagnose_main([f"runs=[{','.join(map(str, runs))}]", f"run_dir={out}", "diagnose.figures=false"]) == 4
    assert "verdict: FAIL" in capsys.readouterr().out and (out / "diagnostics.json").is_file()


def test_command_sweep_directory(tmp_path, config):
    sweep = tmp_path / "multirun"
    for j in range(2):
        write_chain(sweep / str(j), config, healthy(n=600, seed=j), seed=j)
    (sweep / "multirun.yaml").write_text("{}")
    out = tmp_path / "diag"
    code = diagnose_main([f"sweep={sweep}", f"run_dir={out}", "diagnose.figures=false"])
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
    assert diagnose_main([*args, f"run_dir={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fli-diagnose: error:") and match in err[0], err
    assert not (out / "diagnostics.json").exists()


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
    code = diagnose_main([f"runs=[{runs[0]},{runs[1]}]", f"run_dir={out}"])
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
    for name in ("trace", "rank", "corner", "energy", "s8_prior", "field_pk", "field_slices", "mass_maps", "maps", "r_k",
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
    assert diagnose_main([f"runs=[{runs[0]},{runs[1]}]", f"run_dir={out}"]) in (0, 1, 2)
    page = out / "report.html"
    text = page.read_text()
    n_fig = len(json.loads((out / "diagnostics.json").read_text())["figures"])
    assert n_fig >= 6
    refs = re.findall(r'(?:src|href)="([^"]*)"', text)
    assert refs and all(r.startswith("data:image/png;base64,") for r in refs), [r[:40] for r in refs]
    base = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    shot = tmp_path / "shot.png"
    r = subprocess.run([*base, f"--screenshot={shot}", "--window-size=1200,8000", page.as_uri()],
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


def test_the_report_sets_the_posterior_beside_the_map_and_muse_of_the_start(tmp_path, config):
    """Chains started from a fli-map run (init=<its dir>): the estimates table carries that run's
    MAP, its Laplace sd and MUSE's mean and sd, the corner plot draws MUSE's Gaussian, and each
    posterior row says how wide it is against the prior and (without a truth) nothing of one."""
    fit = tmp_path / "map"
    fit.mkdir()
    muse = {"params": {"Omega_c": 0.27, "sigma8": 0.79, "Omega_m": 0.319, "S8": 0.815},
            "sd": {"Omega_c": 0.03, "sigma8": 0.04, "Omega_m": 0.03, "S8": 0.05},
            "theta_z": [-0.5, -0.03], "cov_z": [[0.04, -0.01], [-0.01, 0.03]]}
    (fit / "map.json").write_text(json.dumps({
        "params": {"Omega_c": 0.25, "sigma8": 0.85, "Omega_m": 0.299, "S8": 0.848},
        "laplace": {"marginal": {"std": {"Omega_c": 0.02, "sigma8": 0.05}}}, "muse": muse}))
    started = {**config, "init": str(fit)}
    runs = [write_chain(tmp_path / f"c{j}", started, healthy(n=300, seed=j), seed=j) for j in range(2)]
    out = tmp_path / "diag"
    assert diagnose_main([f"runs=[{runs[0]},{runs[1]}]", f"run_dir={out}"]) in (0, 3, 4)
    rep = json.loads((out / "diagnostics.json").read_text())
    rows = {r["param"]: r for r in rep["estimates"]}
    assert set(rows) == {"Omega_c", "sigma8", "S8"}
    assert rows["sigma8"]["map"] == 0.85 and rows["sigma8"]["map_laplace_sd"] == 0.05
    assert rows["S8"]["muse"] == 0.815 and rows["S8"]["muse_sd"] == 0.05 and rows["S8"]["map_laplace_sd"] is None
    # the healthy chains: sigma8 0.80 +- 0.03 against the prior's uniform [0.5, 1.1] (sd 0.173)
    assert abs(rows["sigma8"]["mean"] - 0.80) < 0.01 and 0.15 < rows["sigma8"]["sd_over_prior_sd"] < 0.2
    assert rows["sigma8"]["truth"] is None and rows["sigma8"]["truth_in_interval99"] is None
    assert (out / "corner.png").is_file() and "corner" in rep["figures"]
    page = (out / "report.html").read_text()
    assert "MUSE ± sd" in page and "0.815 &plusmn; 0.05" in page and "<h2>Configuration</h2>" in page
