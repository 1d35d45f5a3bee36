"""scripts/studies/model_error.py: its mock pairs (the model's and a finer grid's, sharing their
shape noise and large scales), its report, and the claims by which two drivers share a study."""

import numpy as np
import pytest


@pytest.mark.slow(seconds=30)
def test_model_error_pairs_share_their_shape_noise_and_large_scales(tmp_path):
    """scripts/studies/model_error.py --mocks-only as a user runs it: the model and the finer mock of a
    pair differ by their noiseless maps alone (the same shape noise), and those maps share their
    large-scale structure (correlated far more than with another pair's); a --finer that changes
    the pixels is refused in one line with nothing written."""
    import subprocess
    import sys

    from fli.store.io import load_observation
    from tests.helpers.posterior import SMALL
    from tests.helpers.processes import ROOT

    finer = "simulation.mesh=[16,16,64] simulation.halo=3 lensing.n_planes=8"
    r = subprocess.run([sys.executable, "-m", "scripts.studies.model_error", "--out", str(tmp_path / "me"), "--pairs", "2", "--mocks-only",
                        "--finer", finer, "--", *SMALL], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    pair = [tmp_path / "me" / f"pair_{i:03d}" for i in range(2)]
    obs = {m: load_observation(pair[0] / m) for m in ("model", "finer")}
    true = [np.load(p / "noiseless.npz") for p in pair]
    diff = np.asarray(obs["finer"].kappa_obs) - np.asarray(obs["model"].kappa_obs)
    # float32 maps of ~1e-2: the shape noise cancels to rounding
    np.testing.assert_allclose(diff, true[0]["finer"] - true[0]["model"], atol=1e-8)
    assert obs["model"].white_noise is None and obs["model"].truth["sigma8"] == pytest.approx(0.8102)
    corr = lambda a, b: np.mean([np.corrcoef(a[k].ravel(), b[k].ravel())[0, 1] for k in range(len(a))])  # per bin
    same = corr(true[0]["model"], true[0]["finer"])
    other = corr(true[1]["model"], true[0]["finer"])
    # measured 0.54 against -0.05: 64 pixels a bin give a chance correlation an sd of about 0.13
    assert same > 0.35 and same - abs(other) > 0.3, (same, other)
    r = subprocess.run([sys.executable, "-m", "scripts.studies.model_error", "--out", str(tmp_path / "bad"), "--mocks-only",
                        "--finer", "lensing.npix=16", "--", *SMALL], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 2 and "--finer changes lensing.npix" in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "bad").exists()


def _model_error_script():
    from tests.helpers.scripts import load_script

    return load_script("studies/model_error")


def test_model_error_report_reads_muse_and_chain_records_alike(tmp_path):
    """The study's report from kept records of either estimator: the shift is the pair's S8
    difference over the model mock's sd, its Monte Carlo sd the two errors in quadrature over
    that sd, a pair missing a record is left out, and a chain whose S8 R-hat is 1.01 or more
    (or a MUSE run that did not converge) marks its pair unconverged."""
    import json

    me = _model_error_script()

    # (pair, mock, cut): S8, sd, Monte Carlo sd, converged; pair 1 lacks its finer mock
    rows = {(0, "model", "all"): (0.80, 0.10, 0.003, True), (0, "finer", "all"): (0.83, 0.11, 0.004, True),
            (0, "model", "cut"): (0.81, 0.20, 0.006, True), (0, "finer", "cut"): (0.80, 0.20, 0.008, False),
            (1, "model", "all"): (0.90, 0.10, 0.010, True)}

    def record(est, s8, sd, mc, ok):
        if est == "mclmc":  # fli-diagnose's fields, kept by chain_record
            return {"estimator": "mclmc",
                    "params": {"S8": {"mean": s8, "sd": sd, "mcse_mean": mc, "rhat": 1.002 if ok else 1.01}}}
        return {"muse": {"params": {"S8": s8}, "sd": {"S8": sd}, "mc_sd": {"S8": mc}, "converged": ok}}

    for est in ("mclmc", "muse"):
        records = {k: record(est, *v) for k, v in rows.items()}
        keep = tmp_path / est
        keep.mkdir()
        for (i, m, c), rec in records.items():
            (keep / f"pair_{i:03d}_{m}_{c}.json").write_text(json.dumps(rec))
        res = me.report(tmp_path / f"out_{est}", 2, keep, est)
        assert res["estimator"] == est and [(r["pair"], r["cut"]) for r in res["pairs"]] == [(0, "all"), (0, "cut")]
        a, c = res["pairs"]
        assert a["shift_over_sd"] == pytest.approx(0.3) and c["shift_over_sd"] == pytest.approx(-0.05)
        assert a["mc_sd_of_shift_over_sd"] == pytest.approx(0.05) and c["mc_sd_of_shift_over_sd"] == pytest.approx(0.05)
        assert a["converged"] and not c["converged"]
        assert res["summary"]["cut"] == {"pairs": 1, "mean_shift_over_sd": pytest.approx(-0.05), "se": None,
                                         "max_abs_shift_over_sd": pytest.approx(0.05)}
    png = me.figure(res, tmp_path / "shifts.png")  # the muse report's: a PNG, not an empty file
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_two_model_error_drivers_split_a_pairs_analyses_by_their_claims(tmp_path):
    """scripts/studies/study.py's claims, as model_error.py takes them: an analysis held by a live driver
    is refused to another, a pair's claim (its mocks) does not hold its analyses, and a claim
    whose process is gone is taken over."""
    import os
    import subprocess
    import sys


    from scripts.studies.study import claim

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "claim_000_model_all").write_text(str(live.pid))  # another driver's analysis
        (tmp_path / "claim_000").write_text(str(live.pid))  # and its pair's mocks
        assert not claim(tmp_path, "000_model_all")
        assert claim(tmp_path, "000_model_cut") and claim(tmp_path, "000_model_cut")  # ours, and ours again
        assert (tmp_path / "claim_000_model_cut").read_text().split()[0] == str(os.getpid())
        assert not claim(tmp_path, 0)
    finally:
        live.kill()
        live.wait()
    assert claim(tmp_path, "000_model_all") and claim(tmp_path, 0)  # its process is gone: taken over


def test_a_claim_whose_id_a_new_process_has_is_taken_over(tmp_path):
    """A claim names its driver by process id, boot and start time: a claim left by a driver of
    an earlier session, whose id a running process now has, is stale and taken over; the same
    claim with the running process's own start time holds. A claim of the id alone (the old
    form) holds only if that process started before the claim was written."""
    import os
    import subprocess
    import sys


    from fli.store.claim import process_id as _process_id
    from scripts.studies.study import claim

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid, boot, start = _process_id(live.pid).split()
        (tmp_path / "claim_001").write_text(f"{pid} {boot} {int(start) - 1}")  # a dead driver's, the id reused
        assert claim(tmp_path, 1)
        (tmp_path / "claim_002").write_text(f"{pid} {boot} {start}")  # the running process's own
        assert not claim(tmp_path, 2)
        old = tmp_path / "claim_003"  # the id alone, as claims were written before: written before
        old.write_text(pid)  # the process started, it is a dead driver's whose id was reused
        os.utime(old, (0, 0))
        assert claim(tmp_path, 3)
        (tmp_path / "claim_004").write_text(pid)  # written now, while that process runs: held
        assert not claim(tmp_path, 4)
    finally:
        live.kill()
        live.wait()
    assert claim(tmp_path, 2)
