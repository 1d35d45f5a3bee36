"""fli-nuts as a user runs it: a small mock, a chain in chunks, its outputs, where it starts,
bad input, batched chains, HMC, and the resumes it refuses. Runs that stop and go on are in
test_nuts_resume.py.

The small posterior (tests/helpers/posterior.py SMALL: 8x8x32 cells, 4 planes, 8x8 pixels, 2
bins, 2050 latents plus dummies) compiles in seconds; the chains here are a few draws long:
they test the machinery, not convergence (tests/infer/sample/test_nuts_calibration.py and docs/nuts.md do).
"""

import json
import shutil

import numpy as np
import pytest

from fli.cli.nuts import main as nuts_main
from fli.infer.checkpoint import store as ckpt
from fli.infer.sample.run_store import complete_chunks, read_chunks
from tests.helpers.posterior import CHAIN, SMALL, truncate_state


def test_a_chain_writes_its_chunks_and_inference_data(chain):
    import arviz as az
    import zarr

    assert complete_chunks(chain) == [0, 1, 2]
    assert not list((chain / "chunks").glob(".*.tmp"))
    c = read_chunks(chain)
    d, st = c["draws"], c["stats"]
    np.testing.assert_array_equal(d["draw"], np.arange(12))
    np.testing.assert_array_equal(d["warmup"], np.arange(12) < 6)
    for name in ("Omega_c", "sigma8", "Omega_m", "S8"):
        assert d[name].shape == (12,) and np.all(np.isfinite(d[name]))
    # the priors' supports, and the derived quantities from the sampled ones
    assert np.all((d["Omega_c"] > 0.15) & (d["Omega_c"] < 0.45)) and np.all((d["sigma8"] > 0.5) & (d["sigma8"] < 1.1))
    np.testing.assert_allclose(d["S8"], d["sigma8"] * np.sqrt(d["Omega_m"] / 0.3), rtol=1e-6)
    # NUTS's bookkeeping: a depth-d tree takes 2^(d-1) .. 2^d - 1 leapfrog steps, and the
    # gradient count is the start's one plus every step
    assert np.all(st["tree_depth"] <= 3) and np.all(st["n_steps"] >= 1)
    assert np.all((st["n_steps"] <= 2 ** st["tree_depth"] - 1) & (st["n_steps"] >= 2 ** (st["tree_depth"] - 1)))
    np.testing.assert_array_equal(st["gradient_evals"], 1 + np.cumsum(st["n_steps"]))
    assert np.all((st["acceptance_rate"] >= 0) & (st["acceptance_rate"] <= 1))
    assert np.all(np.diff(st["seconds"]) >= 0)
    # each draw's largest particle displacement (PM forward): checked against the halo of 2 cells
    assert np.all((st["max_disp"] > 0) & (st["max_disp"] < 2))
    # spectra per draw: white noise ~ the cell volume (P = V/N), positive for the linear field
    sp = c["spectra"]
    assert sp["pk_white_noise"].shape == (12, sp["k"].size) and np.all(sp["pk_linear"] > 0)
    # ArviZ reads it back: 6 draws after warm-up, 6 warm-up draws, the sample stats ArviZ knows
    idata = az.from_netcdf(chain / "posterior.nc")
    assert idata.posterior.sizes["draw"] == 6 and idata.warmup_posterior.sizes["draw"] == 6
    for name in ("diverging", "energy", "tree_depth", "n_steps", "step_size", "acceptance_rate", "lp",
                 "gradient_evals", "max_disp"):
        assert name in idata.sample_stats, name
    np.testing.assert_array_equal(idata.posterior["sigma8"].values[0], d["sigma8"][6:])
    assert "config" in idata.attrs and json.loads(idata.attrs["pdims"]) == [1, 1]
    assert idata.observed_data["kappa_obs_std"].shape == (2,) and np.all(idata.observed_data["kappa_obs_std"] > 0)
    assert float(az.bfmi(idata)[0]) > 0  # E-BFMI needs the energies, so they must be there
    # thinned fields: every 2nd draw of each chunk (the running mean is checked against the
    # fields in the next test, which keeps them all)
    f = zarr.open_group(str(chain / "chunks" / "chunk_00002" / "fields.zarr"), mode="r")
    assert f["white_noise"].shape == (2, 8, 8, 32) and f["kappa"].shape == (2, 2, 8, 8)
    assert f.attrs["draw"] == [9, 11]
    r = zarr.open_group(str(chain / "running.zarr"), mode="r")
    assert r.attrs["n_draws"] == 6 and np.all(np.asarray(r["var_white_noise"][...]) >= 0)
    out = json.loads((chain / "nuts.json").read_text())
    assert out["draws"] == 12 and out["draws_post_warmup"] == 6 and out["gradient_evals"] == st["gradient_evals"][-1]


@pytest.mark.parametrize("over, match", [
    (["inference.num_warmup=-1"], "inference.num_warmup"),
    (["inference.target_accept=1.5"], "inference.target_accept"),
    (["inference.target_accept=0"], "inference.target_accept"),
    (["inference.field_thin=3"], "inference.field_thin"),
    (["inference.kernel=mala"], "inference.kernel"),
    (["inference.chains_per_run=0"], "inference.chains_per_run"),
    (["inference.init_theta=sigma8"], "inference.init_theta"),
    (["inference.init_theta=muse"], "inference.init_theta=muse chooses theta from a fli-map run, but init=prior"),
])
def test_bad_config_is_refused_and_nothing_written(small_mock, tmp_path, capsys, over, match):
    run = tmp_path / "refused"
    assert nuts_main([*SMALL, f"mock={small_mock}", f"run_dir={run}", *over]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err
    assert not run.exists()


def test_init_from_a_map_of_another_mock_is_refused(small_mock, tmp_path, capsys):
    other = tmp_path / "map_of_another_mock"
    other.mkdir()
    (other / "map.json").write_text(json.dumps({"params": {"Omega_c": 0.26, "sigma8": 0.8}}))
    (other / "config.yaml").write_text(f"mock: {tmp_path / 'somewhere_else'}\n")
    run = tmp_path / "run"
    assert nuts_main([*SMALL, f"mock={small_mock}", f"run_dir={run}", f"init={other}"]) == 2
    err = capsys.readouterr().err
    assert "was made with mock=" in err and "fli-map mock=" in err
    assert not (run / "chunks").exists()
    assert nuts_main([*SMALL, f"mock={small_mock}", f"run_dir={run}", f"init={tmp_path / 'nothing'}"]) == 2
    assert "not 'prior', 'truth', a point file (.json or .npz) or a fli-map run directory" in capsys.readouterr().err



def test_fli_nuts_sends_mclmc_to_fli_sample_and_each_continues_the_others_runs(small_mock, tmp_path, capsys):
    """fli-nuts runs NumPyro's kernels only: inference.kernel=mclmc is refused in one line naming
    the key and fli-sample, exit 2, no run directory left; a run made by either command is one
    that both continue, and one that fli-map refuses, naming who made it."""
    from fli.config import ConfigError
    from fli.store.manifest import SAMPLING, check_kind, write_manifest

    run = tmp_path / "run"
    assert nuts_main([*SMALL, f"mock={small_mock}", f"run_dir={run}", "inference.kernel=mclmc"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "inference.kernel=mclmc" in err[0] and "run fli-sample" in err[0], err
    assert not run.exists()
    for made_by in SAMPLING:
        d = tmp_path / made_by
        write_manifest(d, made_by, {"seed": 0})
        for command in SAMPLING:
            check_kind(d, command)  # raises where it refuses
        with pytest.raises(ConfigError, match=f"is a {made_by} run; fli-map needs"):
            check_kind(d, "fli-map")

# slow: most of the 201 s that this test and the 5 point tests below added to the fresh-clone
# default suite (a vmapped program compiled, a run and its extension); the one-chain machinery
# it builds on stays in the default set (the tests above)
@pytest.mark.slow(seconds=220)  # fresh-clone CI of 469bd9a: 222 s with its set-up
def test_vectorised_chains_are_each_the_chain_of_their_own_key(small_mock, chain, tmp_path):
    """inference.chains_per_run=2: chain 0 is the one-chain run of the same seed (the same
    keys), chain 1 another chain. The vmapped and the unbatched programs differ at float32
    round-off (~1e-7), which the chain amplifies about tenfold a draw: measured 6e-5 (relative)
    by draw 6 and 2.6e-3 by draw 12 once, and 7e-6, 5.5e-5, 5.9e-4 at draws 4, 5, 6 in a
    fresh-clone CI run (which failed the 1e-4 that this test then asked of the first 6 draws).
    With radiation in the background (another posterior, another round-off) a fresh-clone CI
    run measured 3e-4 to draw 10, then 5.6e-3 and 2.4e-2 at draws 11 and 12, which failed the
    1e-2 then asked of all 12. So: the discrete trajectory (tree depths, leapfrog counts) equal
    throughout, the parameters to 1e-4 over the first 4 draws and 1e-2 over the first 8; a
    wrong key or state would change the leapfrog counts at once. The run stops after 8 draws and is extended to 12, so
    the batched checkpoint is restored."""
    import arviz as az

    from fli.infer.diagnose.chains import find_runs

    run = tmp_path / "two"
    base = [*SMALL, *CHAIN, f"mock={small_mock}", f"run_dir={run}", "inference.chains_per_run=2"]
    assert nuts_main([*base, "inference.num_samples=2"]) == 0
    assert complete_chunks(run / "chain_0") == [0, 1] == complete_chunks(run / "chain_1")
    assert nuts_main(base) == 0
    one, c0, c1 = read_chunks(chain), read_chunks(run / "chain_0"), read_chunks(run / "chain_1")
    np.testing.assert_array_equal(c0["stats"]["tree_depth"], one["stats"]["tree_depth"])
    np.testing.assert_array_equal(c0["stats"]["n_steps"], one["stats"]["n_steps"])
    for name in ("Omega_c", "sigma8"):
        np.testing.assert_allclose(c0["draws"][name][:4], one["draws"][name][:4], rtol=1e-4, err_msg=name)
        np.testing.assert_allclose(c0["draws"][name][:8], one["draws"][name][:8], rtol=1e-2, err_msg=name)
        assert not np.allclose(c1["draws"][name], c0["draws"][name]), name  # its own key: another chain
    # each chain's step size is its own (adapted on its own draws)
    assert c0["stats"]["step_size"][-1] != c1["stats"]["step_size"][-1]
    # one posterior.nc with both chains, each chain's own files, and fli-diagnose sees two chains
    idata = az.from_netcdf(run / "posterior.nc")
    assert idata.posterior.sizes["chain"] == 2 and idata.posterior.sizes["draw"] == 6
    np.testing.assert_array_equal(idata.posterior["sigma8"].values[1], c1["draws"]["sigma8"][6:])
    np.testing.assert_array_equal(idata.sample_stats["tree_depth"].values[0], c0["stats"]["tree_depth"][6:])
    for c in (0, 1):
        assert (run / f"chain_{c}" / "running.zarr").is_dir() and (run / f"chain_{c}" / "nuts.json").is_file()
    out = json.loads((run / "nuts.json").read_text())
    assert out["chains_per_run"] == 2 and set(out["chains"]) == {"chain_0", "chain_1"}
    assert out["gradient_evals"] == c0["stats"]["gradient_evals"][-1] + c1["stats"]["gradient_evals"][-1]
    assert find_runs([str(run)], None) == [run / "chain_0", run / "chain_1"]
    # the number of chains is part of the run: another count is refused, naming the key
    assert nuts_main([*base, "inference.chains_per_run=3", "inference.num_samples=10"]) == 2


def test_init_from_a_map_compares_the_observation_by_fingerprint_not_path(small_mock, tmp_path, monkeypatch):
    """A MAP's manifest records its observation's fingerprint: the same mock under another
    spelling of its path is accepted, a MAP of other data is refused naming both fingerprints,
    and a fli-nuts run is not a MAP."""
    from fli.cli.compose import compose
    from fli.config import ConfigError
    from fli.infer.sample.start import check_init_map
    from fli.store.io import load_observation
    from fli.store.manifest import MANIFEST

    cfg, _ = compose([*SMALL, f"mock={small_mock}"])
    obs = load_observation(small_mock)
    map_dir = tmp_path / "map"
    map_dir.mkdir()
    (map_dir / "map.json").write_text(json.dumps({"params": {"Omega_c": 0.26, "sigma8": 0.8}}))
    (map_dir / "config.yaml").write_text("mock: elsewhere\n")
    monkeypatch.chdir(small_mock.parent)
    manifest = {"command": "fli-map", "observation": {"path": f"./{small_mock.name}//mock.zarr/",
                                                      "fingerprint": obs.fingerprint}}
    (map_dir / MANIFEST).write_text(json.dumps(manifest))
    assert check_init_map(cfg, map_dir, obs)["params"]["sigma8"] == 0.8
    manifest["observation"]["fingerprint"] = "0" * 64
    (map_dir / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=f"fingerprint 0000000000000000 .* this one is {obs.fingerprint[:16]}"):
        check_init_map(cfg, map_dir, obs)
    manifest["command"] = "fli-nuts"
    (map_dir / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="is a fli-nuts run, not a fli-map run"):
        check_init_map(cfg, map_dir, obs)


def test_a_given_point_starts_the_chain_there(tmp_path):
    """init=<file>.json sets the parameters (the field drawn from the prior); init=<file>.npz
    sets any of them and the white noise; what is not given is drawn, and nuts.json says which."""
    import jax

    from fli.infer.sample.start import point_start
    from tests.helpers.posterior import small_posterior

    post, _, lat = small_posterior()
    lay, g = post.layout, post.fwd.grid
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    rest = jax.numpy.zeros((lay.size,), g.jdtype)
    js = tmp_path / "start.json"
    js.write_text(json.dumps({"Omega_c": 0.3, "sigma8": 0.75}))
    z, desc = point_start(str(js), post, keys[0], keys[1], rest)
    theta, s = lay.unpack(z)
    np.testing.assert_allclose(np.asarray(post.prior(theta)), [0.3, 0.75], rtol=1e-6)
    assert desc["given"] == ["Omega_c", "sigma8"] and desc["drawn_from_prior"] == ["white_noise"]
    assert 0.8 < float(np.std(np.asarray(s))) < 1.2  # a white-noise draw
    npz = tmp_path / "start.npz"
    field = np.asarray(lat.s) * 0.5
    np.savez(npz, sigma8=0.9, white_noise=field)
    z, desc = point_start(str(npz), post, keys[0], keys[1], rest)
    theta, s = lay.unpack(z)
    np.testing.assert_array_equal(np.asarray(s), field.astype(np.float32))
    np.testing.assert_allclose(float(post.prior(theta)[1]), 0.9, rtol=1e-6)
    assert desc["drawn_from_prior"] == ["Omega_c"]


@pytest.mark.parametrize("content, match", [
    ({"Omega_b": 0.05}, "unknown key(s) ['Omega_b']; valid: ['Omega_c', 'sigma8']"),
    ({"sigma8": 5.0}, "sigma8 = 5 lies outside its prior"),
    ({"sigma8": [0.8, 0.9]}, "sigma8 must be one finite number"),
    ("[1, 2]", "unreadable"),
])
def test_a_bad_point_is_refused_in_one_line(small_mock, tmp_path, capsys, content, match):
    f = tmp_path / "point.json"
    f.write_text(content if isinstance(content, str) else json.dumps(content))
    run = tmp_path / "run"
    assert nuts_main([*SMALL, f"mock={small_mock}", f"run_dir={run}", f"init={f}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0] and str(f) in err[0], err
    assert not (run / "chunks").exists() and not (run / "config.yaml").exists()


@pytest.mark.slow(seconds=110)  # (another compile); 82 s beside two niced studies, warm cache
def test_hmc_kernel_takes_its_fixed_number_of_steps_and_keeps_the_draws_running_mean(small_mock, tmp_path):
    """HMC's fixed trajectories, its resume (its state holds Python scalars beside the arrays),
    and, with field_thin=1 keeping every field, running.zarr's Welford mean and variance
    against the post-warm-up fields' own, across the resume (float32 round-off over 7 draws:
    1e-5; the running moments are the chunks' code, whatever the kernel)."""
    import zarr

    run = tmp_path / "hmc"
    hmc = [*SMALL, f"mock={small_mock}", f"run_dir={run}", "inference.kernel=hmc", "inference.num_steps=5",
           "inference.num_warmup=2", "inference.chunk=3", "inference.field_thin=1"]
    assert nuts_main([*hmc, "inference.num_samples=4"]) == 0
    st = read_chunks(run)["stats"]
    np.testing.assert_array_equal(st["n_steps"], np.full(6, 5))
    np.testing.assert_array_equal(st["gradient_evals"], 1 + 5 * np.arange(1, 7))
    assert json.loads((run / "nuts.json").read_text())["kernel"] == "hmc"
    assert nuts_main([*hmc, "inference.num_samples=7"]) == 0
    assert complete_chunks(run) == [0, 1, 2]
    fields = [np.asarray(zarr.open_group(str(run / "chunks" / f"chunk_{i:05d}" / "fields.zarr"), mode="r")
                         ["white_noise"][...]) for i in (0, 1, 2)]
    s = np.concatenate(fields)[2:]
    assert s.shape[0] == 7
    r = zarr.open_group(str(run / "running.zarr"), mode="r")
    assert r.attrs["n_draws"] == 7
    np.testing.assert_allclose(np.asarray(r["mean_white_noise"][...]), s.mean(0), atol=1e-5)
    np.testing.assert_allclose(np.asarray(r["var_white_noise"][...]), s.var(0, ddof=1), atol=1e-5)


# The default set's resume refusals read the session's chain here, in the file that makes it: in
# test_nuts_resume.py they put it on a second pytest-xdist worker, which built it again.
def test_a_finished_chain_is_left_as_it_is(small_mock, chain, tmp_path, caplog):
    """Started again with the same draw count (e.g. a sweep rerun after a crash), a finished
    chain is reported and nothing is rewritten."""
    run = tmp_path / "copy"
    shutil.copytree(chain, run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and ".hydra" not in p.parts}
    assert nuts_main([*SMALL, *CHAIN, f"mock={small_mock}", f"run_dir={run}"]) == 0
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and ".hydra" not in p.parts} == before


def test_resuming_with_another_model_config_is_refused(small_mock, chain, tmp_path, capsys):
    run = tmp_path / "copy"
    shutil.copytree(chain, run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert nuts_main([*SMALL, *CHAIN, f"mock={small_mock}", f"run_dir={run}", "inference.num_samples=10",
                      "lensing.n_planes=2"]) == 2
    err = capsys.readouterr().err
    assert "lensing.n_planes" in err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # nothing changed


@pytest.mark.slow(seconds=60)  # 45 s beside two niced studies: two fli-nuts runs, each compiling its chunk
def test_particles_outrunning_the_halo_stop_the_chain_before_the_chunk_is_kept(small_mock, chain, tmp_path, capsys,
                                                                              monkeypatch):
    """The chunk's draws are checked against the halo before anything of the chunk is written
    (here fli.sim.painting's check runs with a halo of 1e-6 cells, which any displacement outruns);
    the same command with a larger halo then resumes the run."""
    from fli.sim import painting

    run = tmp_path / "copy"
    shutil.copytree(chain, run)
    # what a chunk writes (the run's config and manifest say what last ran, and are rewritten)
    kept = lambda: {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and (
        {"chunks", "checkpoints", "running.zarr"} & set(p.parts) or p.name in ("nuts.json", "posterior.nc"))}
    before = kept()
    assert any("chunks" in p.parts for p in before) and (run / "nuts.json") in before
    real = painting.check_halo
    monkeypatch.setattr(painting, "check_halo",
                        lambda m, halo, policy="raise", scheme="cic": real(m, 1e-6, policy, scheme))
    extend = [*SMALL, *CHAIN, f"mock={small_mock}", f"run_dir={run}", "inference.num_samples=10"]
    assert nuts_main(extend) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "simulation.halo: in draws 13-16 of the chain(s) particles moved" in err[0], err
    assert "a larger simulation.halo resumes it after draw 12" in err[0]
    assert kept() == before  # no chunk, checkpoint or summary of the refused draws
    monkeypatch.setattr(painting, "check_halo", real)
    assert nuts_main([*extend, "simulation.halo=3"]) == 0
    assert complete_chunks(run) == [0, 1, 2, 3] and json.loads((run / "nuts.json").read_text())["draws"] == 16


def test_with_every_checkpoint_damaged_the_run_is_refused_in_one_line_and_nothing_rewritten(small_mock, chain,
                                                                                           tmp_path, capsys):
    run = tmp_path / "copy"
    shutil.copytree(chain, run)
    for step in ckpt.all_steps(run / "checkpoints"):
        truncate_state(run / "checkpoints" / str(step))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code = nuts_main([*SMALL, *CHAIN, f"mock={small_mock}", f"run_dir={run}", "inference.num_samples=10"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "checkpoints/" in err[0] and "no earlier checkpoint" in err[0], err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # .hydra/ included
