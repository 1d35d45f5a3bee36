"""The low-rank posterior preconditioner (fli/infer/sample/precondition.py) against dense linear algebra.

* Lanczos with full reorthogonalisation on an explicit symmetric PSD matrix of known spectrum:
  at full rank its Ritz values are the matrix's eigenvalues and ``C^{1/2} C^{1/2}`` is
  ``(I + A)^{-1}`` (NumPy's ``eigh`` and ``inv``, independent of the code under test).
* On the SMALL posterior with the linear forward (8x8x32 cells, 2 bins of 8x8 pixels, 2
  parameters: J is 130 x 2050 with the tail), at full rank: the eigenvalues against those of
  the dense Jacobian's ``J^T J`` (``jax.jacfwd``), and the preconditioned Gauss-Newton
  Hessian ``C^{1/2} (I + J^T J) C^{1/2}`` is the identity, applied to random vectors through
  the dense J; truncated to fewer eigenpairs, only the directions kept are whitened.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def _psd(n, rank, seed=0):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.normal(size=(n, rank)))
    lam = np.geomspace(1e3, 1e-2, rank)  # a spectrum spanning 5 decades, like J^T J's
    return (u * lam) @ u.T, np.sort(lam)[::-1]


def test_lanczos_full_rank_matches_eigh_and_the_inverse():
    from fli.infer.fit.lowrank import LowRank, lanczos_start, lanczos_steps, ritz, sqrt_cov

    n, rank = 200, 40
    a, lam_true = _psd(n, rank)
    aj = jnp.asarray(a, jnp.float32)
    v0 = jnp.asarray(np.random.default_rng(1).normal(size=n), jnp.float32)
    # 60 steps on a rank-40 operator: Lanczos breaks down after 40 and the rest must be zeros
    st = jax.jit(lambda st: lanczos_steps(lambda v: aj @ v, st, 60))(lanczos_start(v0, 60))
    vecs, lam = ritz(st)
    # float32 products on a 1e5 condition number: eigenvalues to ~1e-4 of the largest
    np.testing.assert_allclose(lam[:rank], lam_true, rtol=1e-3, atol=1e-4 * lam_true[0])
    assert np.all(lam[rank:] < 1e-4 * lam_true[0])
    q = np.asarray(vecs)[:rank]
    np.testing.assert_allclose(q @ q.T, np.eye(rank), atol=1e-4)  # orthonormal
    pre = LowRank(jnp.zeros(n), vecs, jnp.asarray(lam, jnp.float32))
    half = np.asarray(jax.vmap(lambda y: sqrt_cov(pre, y))(jnp.eye(n, dtype=jnp.float32)))
    np.testing.assert_allclose(half @ half, np.linalg.inv(np.eye(n) + a), atol=2e-4)


@pytest.fixture(scope="module")
def linear():
    from tests.helpers.posterior import small_posterior

    post, data, truth = small_posterior(extra=["simulation.forward=linear"])
    return post, data, post.layout.pack(truth.theta, truth.s)


@pytest.mark.slow(seconds=175)  # 128 and 176 s in two CI runs, cold: the dense Jacobian, Lanczos 3 ways, the products
def test_lowrank_whitens_the_linear_posterior(linear):
    from fli.infer.fit.lowrank import build_lowrank, residual_flat, sqrt_cov, to_y, to_z

    post, data, z = linear
    lay = post.layout
    jac = np.asarray(jax.jit(jax.jacrev(lambda x: residual_flat(post)(x, data).reshape(-1)))(z), np.float64)
    assert jac.shape == (128, lay.size)  # [bins x pixels, flat latent]
    jtj = jac.T @ jac
    lam_true = np.sort(np.linalg.eigvalsh(jtj))[::-1]
    rank = 130  # J's rank is at most 128 map values + 2 parameters

    pre, info = build_lowrank(post, data, z, rank, jax.random.key(0))
    assert info["rank"] == 130 and info["grad_evals"] == 260
    lam = np.asarray(info["eigenvalues"])
    # float32 Lanczos: the top eigenvalues to 1e-3; beyond J's 128 rows, nothing
    np.testing.assert_allclose(lam[:20], lam_true[:20], rtol=1e-3)
    assert np.all(lam[128:] < 1e-4 * lam[0])

    rng = np.random.default_rng(3)
    ys = jnp.asarray(rng.normal(size=(4, lay.size)), jnp.float32)
    half = lambda y: np.asarray(jax.jit(jax.vmap(lambda v: sqrt_cov(pre, v)))(y), np.float64)
    cy = half(ys)
    hcy = cy + (cy @ jac.T) @ jac  # (I + J^T J) C^{1/2} y with the dense J
    back = half(jnp.asarray(hcy, jnp.float32))
    # the whitened Hessian is the identity to float32 accuracy over a condition number
    # 1 + lam_max (~1e4 here): 1e-3 relative
    err = np.linalg.norm(back - np.asarray(ys), axis=1) / np.linalg.norm(np.asarray(ys), axis=1)
    assert np.all(err < 1e-3), err
    # to_y inverts to_z
    np.testing.assert_allclose(np.asarray(to_y(pre, to_z(pre, ys[0]))), np.asarray(ys[0]), atol=1e-4)
    # the reverse route (J v as the transpose of J^T, which the PM forward's custom_vjp needs)
    # builds the same operator: the same top eigenvalues from the same start
    _, rev = build_lowrank(post, data, z, 16, jax.random.key(0), ad="reverse")
    assert rev["ad"] == "reverse" and info["ad"] == "forward"
    np.testing.assert_allclose(rev["eigenvalues"][:6], lam_true[:6], rtol=1e-3)
    # the curvature averaged over points (inference.precondition_points), here 3 copies of z:
    # the average of three equal operators is the operator, at 3 times the cost
    _, avg = build_lowrank(post, data, z, 16, jax.random.key(0), at=jnp.stack([z, z, z]))
    assert avg["points"] == 3 and avg["grad_evals"] == 96
    np.testing.assert_allclose(avg["eigenvalues"][:6], lam_true[:6], rtol=1e-3)

    # truncated to the top 4: those directions are whitened, the rest of H is left as it is
    from fli.infer.sample.precondition import LowRank

    pre4 = LowRank(pre.ref, pre.vecs[:4], pre.lam[:4])
    v = np.asarray(pre.vecs, np.float64)
    w = np.asarray(jax.vmap(lambda x: sqrt_cov(pre4, x))(jnp.asarray(v[:8], jnp.float32)), np.float64)
    quad = np.einsum("in,in->i", w, w + (w @ jac.T) @ jac)  # v^T C4^1/2 H C4^1/2 v
    np.testing.assert_allclose(quad[:4], 1.0, rtol=2e-3)
    np.testing.assert_allclose(quad[4:], 1.0 + lam_true[4:8], rtol=2e-3)  # untouched: 1 + lam_i
    # not trivial: the eigenvalues left out are not small (measured 3.7, 3.2, 2.3, 2.1; the
    # spectrum falls below 1 after 9 directions, so the data constrain few modes of this mock)
    assert lam_true[4] > 1


# 239 and 219 s in two CI runs (cold): a 4-step MAP, then fli-nuts built, extended and refused
@pytest.mark.slow(seconds=220)
def test_fli_nuts_builds_stores_and_reuses_the_preconditioner(small_mock, tmp_path, caplog, capsys):
    """fli-nuts with inference.precondition=lowrank on the small mock (the linear forward, which
    compiles in a fraction of the PM's time): built at the MAP of init=<fli-map run>, stored
    with the run, read back (not rebuilt) when the run is extended, and refused, naming init,
    where there is no MAP to build it at."""
    import json
    import logging

    from fli.cli.map import main as map_main
    from fli.cli.nuts import main as nuts_main
    from tests.helpers.posterior import CHAIN, SMALL

    linear = [*SMALL, "simulation.forward=linear"]
    mp = tmp_path / "map"
    assert map_main([*linear, f"mock={small_mock}", f"run_dir={mp}", "inference.map.steps=4",
                     "inference.map.laplace=false", "inference.map.compare_truth=false"]) == 0
    run = tmp_path / "nuts"
    args = [*linear, *CHAIN, f"mock={small_mock}", f"init={mp}", "inference.precondition=lowrank",
            "inference.precondition_rank=16", "inference.projections=4"]
    assert nuts_main([*args, f"run_dir={run}"]) == 0
    out = json.loads((run / "nuts.json").read_text())
    assert out["projections"]["source"] == "preconditioner" and out["projections"]["count"] == 4
    _check_projections(run, run / "preconditioner.zarr", 4)
    pre = out["preconditioner"]
    assert pre["rank"] == 16 and pre["grad_evals"] == 32 and pre["point"] == str(mp)
    assert pre["eigenvalue_largest"] > pre["eigenvalue_smallest_kept"] > 0
    assert out["init"]["redraw"] == "linearised" and out["init"]["theta"] == "prior"
    assert (run / "preconditioner.zarr" / "COMPLETE").is_file()
    assert np.isfinite(out["params_mean"]["S8"])

    caplog.set_level(logging.INFO, logger="fli")
    assert nuts_main([*args, f"run_dir={run}", "inference.num_samples=10"]) == 0  # extended by 4 draws
    assert "preconditioner: read" in caplog.text and "Lanczos step" not in caplog.text
    again = json.loads((run / "nuts.json").read_text())
    assert again["draws"] == 16 and again["preconditioner"] == pre

    # without a preconditioner, the run builds its own directions at the MAP (3 Lanczos steps a
    # direction kept) and stores them
    own = tmp_path / "own"
    assert nuts_main([*linear, *CHAIN, f"mock={small_mock}", f"init={mp}", "inference.projections=3",
                      f"run_dir={own}"]) == 0
    p = json.loads((own / "nuts.json").read_text())["projections"]
    assert p["source"] == "lanczos" and p["count"] == 3 and p["grad_evals"] == 18
    _check_projections(own, own / "projections.zarr", 3)

    bad = tmp_path / "bad"
    capsys.readouterr()
    assert nuts_main([*linear, *CHAIN, f"mock={small_mock}", "init=prior", "inference.precondition=lowrank",
                      f"run_dir={bad}"]) == 2
    assert "set init=<a fli-map run directory" in capsys.readouterr().err
    assert not (bad / "preconditioner.zarr").exists() and not (bad / "nuts.json").exists()


def _check_projections(run, store, k):
    """Each thinned draw's recorded projections, recomputed in numpy from what the run stored:
    the draw's white noise (fields.zarr) and parameters (draws.npz, through the prior's inverse
    transform) against the stored vectors and centre: ``v . (z - ref)``, z = (theta_z, s)."""
    import zarr

    from fli.cli.compose import compose
    from fli.infer.posterior.priors import PriorTransform
    from fli.infer.sample.run_store import chunk_dir, complete_chunks
    from tests.helpers.posterior import SMALL

    prior = PriorTransform.from_config(compose(SMALL)[0].prior)
    vec = zarr.open_group(str(store), mode="r")
    vt, vf = np.asarray(vec["vecs_theta"])[:k], np.asarray(vec["vecs_field"])[:k]
    rt, rf = np.asarray(vec["ref_theta"]), np.asarray(vec["ref_field"])
    checked = 0
    for i in complete_chunks(run):
        d = chunk_dir(run, i)
        with np.load(d / "spectra.npz") as f:
            proj, draw = f["projections"], f["draw"]
        with np.load(d / "draws.npz") as f:
            params = {n: f[n] for n in prior.names}
        assert proj.shape == (len(draw), k) and np.all(np.isfinite(proj))
        fields = zarr.open_group(str(d / "fields.zarr"), mode="r")
        for j, dr in enumerate(fields.attrs["draw"]):
            row = int(np.where(draw == dr)[0][0])
            theta_z = prior.inverse([float(params[n][row]) for n in prior.names])
            s = np.asarray(fields["white_noise"][j], np.float64)
            want = vf.reshape(k, -1) @ (s - rf).ravel() + vt @ (theta_z - rt)
            # a float32 sum of 2050 terms against float64: measured 5.4e-7 at most (projections up
            # to 0.9); 1e-5 is 20x that, and 100x below what a 1 % error in them would leave
            np.testing.assert_allclose(proj[row], want, rtol=0, atol=1e-5)
            checked += 1
    assert checked >= 3
