"""MUSE (fli/infer/muse/estimator.py) against the linear forward's exact posterior (fli/infer/posterior/exact.py).

For a Gaussian field observed linearly, the MUSE score ``g(theta, d) - E_x g(theta, x)`` is the
marginal likelihood's own score (``g = b^T C^-1 dA A^T C^-1 b`` at the field's MAP, and
``d/dtheta log N(b; 0, C)`` differs from it by a constant), and H, the derivative of the mean
score in the simulations' theta, is the Fisher information ``tr(C^-1 dC C^-1 dC) / 2``. So on
the linear forward MUSE must land on the exact marginal posterior's mode, within its own Monte
Carlo error, and its H must be the Fisher matrix of the exact evidence. Neither reference uses
MUSE's code: the mode maximises ``exact.log_posterior`` with scipy, the Fisher matrix comes from
``C = I + A A^T`` by central differences of ``A``.

SMALL posterior (8x8x32 cells, 2 bins of 8x8 pixels) with sigma_e = 0.05: the data halve
sigma8's prior width (measured, exact grid: z-space posterior sds 0.71 and 0.51).
"""

import json
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.posterior import SMALL

LINEAR = [*SMALL, "simulation.forward=linear", "distributed.pdims=[1,1]", "survey.sigma_e=0.05"]
TRUTH = {"Omega_c": 0.2607, "sigma8": 0.8102}


@pytest.fixture(scope="module")
def linear():
    from fli.cli.compose import compose
    from fli.infer.posterior.model import Latents, build_posterior, make_data
    from fli.sim.sharding import make_mesh, white_noise
    from fli.lensing.survey import add_noise, noise_sigma

    cfg, _ = compose(LINEAR)
    post = build_posterior(cfg, mesh=make_mesh((1, 1)))
    g = post.fwd.grid
    theta = jnp.asarray(post.theta_of(TRUTH), g.jdtype)
    kappa = jax.jit(lambda lat: post.predict(lat)[0])(Latents(theta, white_noise(0, g.shape, g.mesh, dtype=g.jdtype)))
    sigma = noise_sigma(cfg.survey, cfg.lensing.fov_deg, cfg.lensing.npix)
    noisy = add_noise(jax.random.key(7), kappa, sigma)
    data = make_data(SimpleNamespace(kappa_obs=noisy.kappa, noise_sigma=sigma, mask=None), post.fwd)
    return cfg, post, data, np.asarray(theta)


def _exact_map(post, data, theta):
    """The field's MAP at theta in closed form, ``(I + A^T A)^-1 A^T b`` (float64)."""
    from fli.infer.posterior.exact import response

    a, b = response(post, data, theta)
    a = a.astype(np.float64)
    s = np.linalg.solve(a.T @ a + np.eye(a.shape[1]), a.T @ b.astype(np.float64))
    return s.reshape(post.fwd.grid.shape)


# MUSE's default gtol. At 1e-5 the preconditioned fit meets float32's floor: s = y - 0.97 V V^T y
# in the stiffest directions cancels, and its rounding times their curvature (1 + lam ~ 1000) is a
# gradient of about 1e-5 per cell here (measured: 510 evaluations against 177 plain at 1e-5; 35
# against 137 at 1e-4)
GTOL = 1e-4


def test_the_field_solver_reaches_the_closed_form_map_plain_and_preconditioned(linear):
    """Both routes stop at the same criterion (the field's own gradient) and land on the closed
    form; the preconditioned one, its stiff directions taken away, in fewer evaluations."""
    from fli.infer.muse.field_fit import FieldSolver, field_preconditioner

    cfg, post, data, theta = linear
    want = _exact_map(post, data, theta)
    solver = FieldSolver(post, cfg.inference.map, 2000, GTOL)
    pre, _ = field_preconditioner(post, data, np.zeros(2), 32)  # at the prior's median, not at theta
    evals = {}
    for name, p in (("plain", None), ("preconditioned", pre)):
        s, steps, gn, evals[name] = solver(jnp.asarray(theta), post.zeros().s, data, pre=p)
        assert gn <= GTOL and steps < 2000, (name, gn, steps)
        # gradient RMS 1e-4 per cell, Hessian eigenvalues >= 1: the error is at most ~1e-4 per cell
        # (measured relative errors 2e-4 plain, 1e-4 preconditioned)
        err = np.linalg.norm(np.asarray(s) - want) / np.linalg.norm(want)
        assert err < 1e-3, (name, err)
    assert evals["preconditioned"] < 0.5 * evals["plain"], evals


def test_the_field_preconditioner_holds_the_top_of_the_exact_curvature(linear):
    """Its eigenvalues are the largest of ``A^T A`` (A, the linear forward's whitened response
    to the field, fli.infer.posterior.exact), its vectors orthonormal and zero off the field's entries."""
    from fli.infer.posterior.exact import response
    from fli.infer.muse.field_fit import field_preconditioner

    _, post, data, _ = linear
    theta = np.zeros(2)
    pre, info = field_preconditioner(post, data, theta, 32)
    a, _ = response(post, data, jnp.asarray(theta, post.fwd.grid.jdtype))
    exact = np.linalg.eigvalsh(a.astype(np.float64).T @ a.astype(np.float64))[::-1]
    lam = np.asarray(pre.lam, np.float64)
    assert info["rank"] == 32 and info["grad_evals"] == 64
    # Lanczos finds the extreme eigenvalues first: after 32 steps the top 8 are converged far
    # below float32's 1e-6 (relative 1e-4 leaves room for the float32 products)
    np.testing.assert_allclose(lam[:8], exact[:8], rtol=1e-4)
    assert np.all(lam[8:] <= exact[0] * (1 + 1e-5)) and np.all(lam >= -1e-4 * exact[0])
    v = np.asarray(pre.vecs, np.float64)
    np.testing.assert_allclose(v @ v.T, np.eye(32), atol=1e-5)
    off = np.asarray(post.layout.pack(jnp.zeros(2), jnp.zeros(post.fwd.grid.shape)) == 0) & ~np.asarray(
        post.layout.pack(jnp.zeros(2), jnp.ones(post.fwd.grid.shape)) == 1)
    assert np.abs(v[:, off]).max() == 0.0  # the tails (theta, the dummies): never moved


def test_a_resumed_run_reads_the_fits_preconditioner_it_stored(linear, tmp_path, caplog):
    """fli.infer.muse.run.fits_preconditioner builds and stores it on a run's first start; the
    next start reads the same arrays back and runs no Lanczos step (no gradient is evaluated:
    the build's log line is absent); a store built at another start is not used."""
    import logging

    from fli.infer.muse.run import PRECONDITIONER, fits_preconditioner

    _, post, data, _ = linear
    log = logging.getLogger("test.muse.pre")
    theta0 = np.array([0.1, -0.2])
    with caplog.at_level(logging.INFO, logger="test.muse.pre"):
        pre, info = fits_preconditioner(post, data, theta0, 8, tmp_path, False, log)
    assert (tmp_path / PRECONDITIONER / "COMPLETE").is_file() and info["theta_start"] == [0.1, -0.2]
    built = [r.message for r in caplog.records]
    assert any("Lanczos" in m for m in built), built
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="test.muse.pre"):
        again, info2 = fits_preconditioner(post, data, theta0, 8, tmp_path, False, log)
    msgs = [r.message for r in caplog.records]
    assert not any("Lanczos" in m for m in msgs) and any("read from" in m for m in msgs), msgs
    for a, b in zip(pre, again, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert info2["grad_evals"] == info["grad_evals"] == 16  # the build's own cost, still reported
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="test.muse.pre"):
        other, _ = fits_preconditioner(post, data, np.zeros(2), 8, tmp_path, False, log)
    assert any("building it again" in r.message for r in caplog.records)
    assert not np.array_equal(np.asarray(other.ref), np.asarray(pre.ref))
    # a store cut short by a stop (no COMPLETE marker) is built again, not refused
    (tmp_path / PRECONDITIONER / "COMPLETE").unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="test.muse.pre"):
        fits_preconditioner(post, data, theta0, 8, tmp_path, False, log)
    assert any("is incomplete" in r.message for r in caplog.records)
    assert (tmp_path / PRECONDITIONER / "COMPLETE").is_file()


def test_the_score_is_the_likelihoods_derivative_in_theta(linear):
    """Against central differences of U in theta, the field at its MAP held fixed."""
    from fli.infer.posterior.model import Latents
    from fli.infer.muse.estimator import make_score

    _, post, data, theta = linear
    s = jnp.asarray(_exact_map(post, data, theta), jnp.float32)
    g = np.asarray(make_score(post)(jnp.asarray(theta), s, data))
    u = jax.jit(lambda th: post.potential(Latents(th, s), data, precise=True))
    eps = 1e-2
    for j in range(len(theta)):
        e = np.zeros_like(theta)
        e[j] = eps
        fd = -(float(u(jnp.asarray(theta + e))) - float(u(jnp.asarray(theta - e)))) / (2 * eps) + theta[j]
        # float32 forward: U to ~1e-4 absolute (precise sums) over 2 eps; the step's own error
        # is eps^2/6 of the third derivative, below 1e-3 of the score here
        assert abs(g[j] - fd) < 0.02 * abs(fd) + 0.02, (j, g[j], fd)


def test_a_simulation_keeps_its_noise_at_every_theta_and_the_noise_has_the_datas_sigma(linear):
    """Common random numbers: the same key gives the same white noise and shape noise at any theta
    (the map minus the model's kappa on that white noise); the shape noise has sd sigma_b."""
    from fli.infer.posterior.model import Latents
    from fli.infer.muse.estimator import make_simulator
    from fli.sim.sharding import white_noise

    _, post, data, theta = linear
    g = post.fwd.grid
    sim = make_simulator(post)
    pred = jax.jit(lambda th, s: post.predict(Latents(th, s))[0])
    sigma = np.asarray(data.sigma)[:, None, None]
    pulls = []
    for i in range(8):
        key = jax.random.fold_in(jax.random.key(5), i)
        s = white_noise(jax.random.split(key)[0], g.shape, g.mesh, dtype=g.jdtype)
        res = []
        for th in (theta, theta + np.array([0.4, -0.3], np.float32)):
            x = sim(jnp.asarray(th), key, data)
            res.append(np.asarray(x.kappa_obs) - np.asarray(pred(jnp.asarray(th), s)))
        np.testing.assert_allclose(res[0], res[1], atol=1e-6 * sigma.max() + 1e-9)
        pulls.append(res[0] / sigma)
    pulls = np.concatenate([p.ravel() for p in pulls])
    # 1024 unit normals: the sample variance's sd is sqrt(2 / 1024) = 0.044; 4 of them
    assert abs(pulls.var() - 1) < 4 * np.sqrt(2 / pulls.size) and abs(pulls.mean()) < 4 / np.sqrt(pulls.size)


def test_h_refits_keep_their_own_step_budget_in_the_same_compiled_solver(linear, caplog):
    """``inference.map.muse.h_steps``: H's refits stop at their budget while the fits at theta run
    to map_steps, through one compiled solver (the budget is an argument, not a constant), and
    the warning about fits ended at their budget names the key that sets it."""
    import logging

    from fli.infer.muse.estimator import Muse

    cfg, post, data, _ = linear
    settings = SimpleNamespace(n_sims=4, iterations=1, tol=0.05, fd_step=0.05, map_steps=1000, h_steps=2, gtol=1e-5)
    m = Muse(post, data, settings, cfg.inference.map, seed=0, log=logging.getLogger("fli"))
    theta = np.zeros(2)
    m.scores("it0", theta)
    assert not m.at_budget  # every fit at theta reached gtol within map_steps
    with caplog.at_level(logging.WARNING, logger="fli"):
        m.finite_difference_h("it0", theta, m._progress("H", 2 * settings.n_sims, h=True))
    recs = {name: m.store.get(name, theta) for name in m.store._d}
    h_fits = [r for n, r in recs.items() if "/h" in n]
    at_theta = [r for n, r in recs.items() if "/h" not in n]
    assert len(h_fits) == 16 and len(at_theta) == 5
    # a refit from a field O(fd_step) away, stopped after 2 steps, is short of gtol
    assert all(r["steps"] == 2 and r["grad_rms"] > settings.gtol for r in h_fits)
    assert all(2 < r["steps"] < 1000 for r in at_theta)  # the fits at theta ran to gtol
    # the budget is an argument: another one compiles nothing new
    compiled = m.solver._solve._cache_size()
    x = m.simulate(jnp.asarray(theta + [settings.fd_step, 0], jnp.float32), m.sim_key(0), data)
    assert m.solver(jnp.asarray(theta, jnp.float32), m.warm["sim0"], x, 5)[1] == 5
    assert m.solver._solve._cache_size() == compiled
    assert "16 of the fits ended at inference.map.muse.h_steps = 2" in caplog.text
    assert "raise h_steps for a sharper one" in caplog.text  # the linear forward's U is smooth
    # on PM with CIC no budget helps (docs/muse_studies.md): the warning names TSC instead
    pm = SimpleNamespace(post=SimpleNamespace(fwd=SimpleNamespace(kind="pm", grid=SimpleNamespace(assignment="cic"))))
    assert "simulation.assignment=tsc" in Muse._remedy(pm, "map_steps")
    pm.post.fwd.grid.assignment = "tsc"
    assert Muse._remedy(pm, "map_steps") == "raise map_steps for a sharper one"


@pytest.fixture(scope="module")
def muse_run(linear):
    from fli.infer.muse.field_fit import field_preconditioner
    from fli.infer.muse.estimator import Muse

    cfg, post, data, _ = linear
    # estimate "root": on the linear forward the root of F is the exact marginal mode (the tests
    # below); the posterior's mean given the score is tests/infer/muse/test_muse_estimate.py's. The
    # fits preconditioned as fli-map's are by default (the plain solver: the closed-form test above)
    settings = SimpleNamespace(n_sims=32, j_sims=40, iterations=8, tol=0.05, fd_step=0.05, map_steps=1000, gtol=1e-4,
                               estimate="root")
    pre, _ = field_preconditioner(post, data, np.zeros(2), 32)
    m = Muse(post, data, settings, cfg.inference.map, seed=0, pre=pre)
    return m, m.run(np.zeros(2))


def _exact_mode(post, data, start):
    from scipy.optimize import minimize

    from fli.infer.posterior.exact import _gaussian_logpdf, _Response

    resp = _Response(post, data)
    f = lambda z: 0.5 * z @ z - _gaussian_logpdf(*resp(z))
    return minimize(f, start, method="Nelder-Mead", options={"xatol": 1e-5, "fatol": 1e-8}).x, resp


# the MUSE fixture took 99 s with plain fits; preconditioned, 42 s (2026-12-07, beside two niced
# studies, this file's compilation cache warm) + 3 s for the exact mode
@pytest.mark.slow(seconds=60)
def test_muse_lands_on_the_exact_marginal_posteriors_mode(linear, muse_run):
    _, post, data, _ = linear
    r = muse_run[1]
    assert r.converged
    mode, _ = _exact_mode(post, data, r.theta_z)
    d = r.theta_z - mode
    # chi^2 with 2 degrees of freedom under MUSE's own Monte Carlo covariance (N = 32
    # simulations); 13.8 is its 99.9 % point
    chi2 = float(d @ np.linalg.solve(r.mc_cov_z, d))
    assert chi2 < 13.8, (r.theta_z, mode, np.sqrt(np.diag(r.mc_cov_z)), chi2)
    # and the Monte Carlo error is small beside the estimate's own width, or the check says little
    assert np.all(np.sqrt(np.diag(r.mc_cov_z)) < 0.2 * r.sd_z)


@pytest.mark.slow(seconds=5)  # shares muse_run; 4 responses of A
def test_muse_h_is_the_exact_fisher_information(linear, muse_run):
    _, post, data, _ = linear
    r = muse_run[1]
    _, resp = _exact_mode(post, data, r.theta_z)

    def cmat(z):
        a = resp(z)[0].astype(np.float64)
        return a @ a.T + np.eye(a.shape[0])

    z, e = r.theta_z, 1e-2
    dc = [(cmat(z + e * np.eye(2)[j]) - cmat(z - e * np.eye(2)[j])) / (2 * e) for j in range(2)]
    ci = np.linalg.inv(cmat(z))
    fisher = np.array([[0.5 * np.trace(ci @ dc[i] @ ci @ dc[j]) for j in range(2)] for i in range(2)])
    # H's Monte Carlo error: the sd of the simulations' finite-difference columns over sqrt(N);
    # 4 of them, plus 2 % for the two finite differences' truncation (steps 0.05 and 0.01)
    se = r.h_columns.std(0, ddof=1) / np.sqrt(r.h_columns.shape[0])
    assert np.all(np.abs(r.h - fisher) < 4 * se + 0.02 * np.abs(fisher).max()), (r.h, fisher, se)


@pytest.mark.slow(seconds=1)  # shares muse_run; one response of A and 40 simulations, 1 s measured
def test_muse_j_is_the_covariance_of_the_exact_marginal_scores_of_its_j_sims_simulations(linear, muse_run):
    """On the linear forward g is the marginal likelihood's score plus a constant (the Woodbury
    identity): so J, over inference.map.muse.j_sims = 40 simulations at the last point (8 more
    than the iteration's), must be the covariance of the exact marginal scores of those same 40
    simulated data sets, closed form, to the fits' tolerance. This pins which simulations J is
    over (keys 0-39, each once), and that the estimate's Monte Carlo error stays the iteration's
    (n_sims = 32, the simulations of its last step)."""
    from fli.infer.posterior.exact import _Response

    _, post, data, _ = linear
    m, r = muse_run
    assert r.sim_scores.shape == (40, 2) and r.h_columns.shape[0] == 32
    resp = _Response(post, data)
    z, e = r.history[-1]["theta_z"], 1e-2  # the last point, where the scores were taken
    a = resp(np.asarray(z))[0].astype(np.float64)
    ci = np.linalg.inv(a @ a.T + np.eye(a.shape[0]))
    dc = []
    for j in range(2):
        ap, am = (resp(np.asarray(z) + s * e * np.eye(2)[j])[0].astype(np.float64) for s in (1, -1))
        dc.append((ap @ ap.T - am @ am.T) / (2 * e))
    keep, w = resp.keep, np.asarray(data.weight).reshape(-1)[resp.keep]
    exact = []
    for i in range(40):
        x = m.simulate(m._dtype(z), m.sim_key(i), data)
        y = ci @ (np.asarray(x.kappa_obs, np.float64).reshape(-1)[keep] * w)
        exact.append([0.5 * y @ dc[j] @ y for j in range(2)])  # the trace term is a constant
    exact = np.asarray(exact)
    # g - S is one constant for every simulation; the fits stop at a gradient RMS of 1e-4 per
    # cell, and the finite difference of C is good to e^2 ~ 1e-4 relative: 1 % of J is far above both
    assert np.allclose(r.j, np.cov(exact.T), rtol=0.01, atol=0.01 * np.abs(r.j).max()), (r.j, np.cov(exact.T))
    assert np.allclose(r.mc_cov_z * 32, np.linalg.inv(np.asarray(r.history[-1]["newton_matrix"])) @ r.j
                       @ np.linalg.inv(np.asarray(r.history[-1]["newton_matrix"])).T, rtol=1e-6)


# 182 s beside two niced studies (2026-12-07) with plain fits; the same test with the Laplace step
# off took 108 s there (the step's compile and run in the first fli-map, which the resumed one
# reads back). With the preconditioned fits (the default since): 92 s, the compilation cache warm
@pytest.mark.slow(seconds=150)
def test_fli_map_muse_reports_both_estimators_resumes_fit_by_fit_and_starts_where_told(tmp_path, caplog):
    """As a user runs it: a linear mock, then ``fli-map inference.map.estimator=muse``, with the
    data's field at the estimate, from which a chain starts. Then the
    run is cut as a stop in the middle of MUSE would leave it (map.json not written, the scores'
    file cut mid-line) and started again: it repeats only the fits it lost and ends where the
    whole run ended (the refitted fields start from zero instead of their last MAP, so equal to
    the fields' tolerance, not bitwise), with no optimiser step compiled for the finished joint MAP
    and its Laplace block read back, not computed again."""
    import logging

    from fli.cli.map import main as map_main
    from fli.cli.mock import main as mock_main

    mock, run = tmp_path / "mock", tmp_path / "map"
    assert mock_main([*LINEAR, f"run_dir={mock}"]) == 0
    args = [*LINEAR, f"mock={mock}", f"run_dir={run}", "inference.map.steps=60", "inference.map.estimator=muse",
            "inference.map.muse.n_sims=8", "inference.map.muse.j_sims=12"]
    assert map_main(args) == 0
    first = json.loads((run / "map.json").read_text())
    assert first["laplace"]["n_hvp"] > 0 and (run / "laplace.json").is_file()
    m = first["muse"]
    assert m["estimator"] == "muse" and first["estimators"]["params"] == "joint MAP" and "muse" in first["estimators"]
    assert set(m["params"]) == {"Omega_c", "sigma8", "Omega_m", "S8"} and all(v > 0 for v in m["sd"].values())
    assert m["converged"] and (run / "estimates.png").stat().st_size > 0
    # the fits preconditioned by default, the preconditioner's cost reported beside the fits'
    assert m["settings"]["precondition_rank"] == 32 and m["preconditioner"]["rank"] == 32
    assert m["preconditioner"]["grad_evals"] == 64 and m["preconditioner"]["eigenvalue_largest"] > 1
    for k, (lo, hi) in m["interval68"].items():  # the pushforward's mean and median inside its 68 % interval
        assert lo < m["median"][k] < hi and lo < m["params"][k] < hi, (k, lo, hi, m["median"][k], m["params"][k])
    _check_muse_field(run, m)
    _check_a_chain_starts_from_muse(mock, run, m, tmp_path)
    lines = (run / "muse_scores.jsonl").read_text().splitlines()
    keep = len(lines) // 2
    (run / "map.json").unlink()
    (run / "muse_scores.jsonl").write_text("\n".join(lines[:keep]) + "\n" + lines[keep][:20])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fli"):
        assert map_main(args) == 0
    assert f"resuming with {keep} fits" in caplog.text
    # the joint MAP was at its end: nothing compiled or refitted for it, its Laplace block read back
    assert "is the fit's end: no optimiser step" in caplog.text and "compiled the optimiser step" not in caplog.text
    assert "Laplace: read back from" in caplog.text and "Laplace (exact Hessian)" not in caplog.text
    # the fits' preconditioner read back, not built again; its cost still reported as the build's
    assert "preconditioner read from" in caplog.text and "Lanczos step" not in caplog.text
    resumed = json.loads((run / "map.json").read_text())
    assert resumed["laplace"] == first["laplace"] and resumed["params"] == first["params"]
    again = resumed["muse"]
    assert again["preconditioner"] == m["preconditioner"]
    assert len((run / "muse_scores.jsonl").read_text().splitlines()) == len(lines)  # the cut line dropped
    # the cost counts the fits read back too: the resumed run made about half of them itself
    assert again["grad_evals_this_run"] < 0.8 * again["grad_evals"], again["grad_evals_this_run"]
    assert again["grad_evals"] > 0.9 * m["grad_evals"] and m["grad_evals_this_run"] == m["grad_evals"]
    d = np.asarray(again["theta_z"]) - np.asarray(m["theta_z"])
    assert np.all(np.abs(d) < 0.02 * np.asarray(m["sd_z"])), (again["theta_z"], m["theta_z"])
    # inference.map.muse.start at the root of F (theta_z is the posterior's mean given the score,
    # the default estimate): the root is where it was, so the first Newton step is already below
    # tol (0.05 sd) and the run ends after one iteration, at a fraction of the cost from the
    # prior's median
    assert m["estimate"] == "posterior" and len(m["theta_root_z"]) == 2
    from fli.infer.muse.result import estimates_of_record  # the reports' reading of a record: the run's own

    np.testing.assert_allclose(estimates_of_record(m)["posterior"], m["theta_z"], rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(estimates_of_record(m)["root"], m["theta_root_z"])
    assert set(m["root_median"]) == set(m["median"]) and len(m["theta_z_bootstrap_sd"]) == 2
    started = tmp_path / "started"
    z = ",".join(f"{v:.6f}" for v in m["theta_root_z"])
    with caplog.at_level(logging.INFO, logger="fli"):
        assert map_main([*(a for a in args if not a.startswith("run_dir=")), f"run_dir={started}",
                         f"inference.map.muse.start=[{z}]", "inference.map.laplace=false"]) == 0
    assert f"from theta_z = {np.round(m['theta_root_z'], 4).tolist()} (inference.map.muse.start)" in caplog.text
    s = json.loads((started / "map.json").read_text())["muse"]
    assert s["converged"] and s["iterations"] == 1 < m["iterations"], (s["iterations"], m["iterations"])
    d = np.asarray(s["theta_root_z"]) - np.asarray(m["theta_root_z"])
    assert np.all(np.abs(d) < 0.05 * np.asarray(m["sd_z"])), (s["theta_root_z"], m["theta_root_z"])
    assert s["grad_evals"] < 0.7 * m["grad_evals"], (s["grad_evals"], m["grad_evals"])


def _check_muse_field(run, m):
    """``muse_field.zarr`` is the data's field MAP at MUSE's estimate: the field's gradient of U
    there is ~0 (the fit's tolerance), and ~0 nowhere else: not at the joint MAP's theta."""
    import zarr

    from fli.cli.compose import compose
    from fli.infer.posterior.model import Latents, build_posterior, make_data
    from fli.store.io import load_observation
    from fli.sim.sharding import make_mesh

    store = run / "muse_field.zarr"
    assert (store / "COMPLETE").is_file()
    z = zarr.open_group(str(store), mode="r")
    np.testing.assert_array_equal(z.attrs["theta_z"], m["theta_z"])
    cfg, _ = compose([*LINEAR, f"mock={run.parent / 'mock'}"])
    mesh = make_mesh((1, 1))
    obs = load_observation(cfg.mock, mesh)
    post = build_posterior(cfg, obs, mesh=mesh)
    data = make_data(obs, post.fwd)
    s = jnp.asarray(z["white_noise"][...])
    rms = lambda th: float(jnp.sqrt(jnp.mean(jax.grad(lambda s_: post.potential(Latents(th, s_), data))(s) ** 2)))
    at_muse = rms(jnp.asarray(m["theta_z"], s.dtype))
    joint = json.loads((run / "map.json").read_text())["params"]
    at_joint = rms(jnp.asarray(post.theta_of(joint), s.dtype))
    # the gradient's RMS per cell: the solver stops below its gtol of 1e-4 (measured 5.0e-5;
    # 1e-3 leaves room for a fit ended by its step budget). At the joint MAP's theta the same
    # field is far from stationary (measured 9.2), so the check can tell the two apart
    assert at_muse < 1e-3 and at_joint > 100 * at_muse, (at_muse, at_joint)


def _check_a_chain_starts_from_muse(mock, run, m, tmp_path):
    """fli-sample init=<a fli-map run with a MUSE estimate> starts theta from MUSE (auto), with the
    field of muse_field.zarr; inference.init_theta=muse on a run without MUSE is refused."""
    from fli.cli.sample import main as sample_main
    from tests.helpers.posterior import CHAIN

    chain = tmp_path / "chain"
    assert sample_main([*LINEAR, *CHAIN, "inference.kernel=nuts", f"mock={mock}", f"init={run}", f"run_dir={chain}"]) == 0
    init = json.loads((chain / "nuts.json").read_text())["init"]
    assert init["theta"] == "muse" and init["field"] == "muse_field.zarr", init


def test_broydens_newton_matrix_finds_the_root_where_the_expected_one_cycles():
    """F linear with a derivative twice the expected one, -2 (H + I): Newton's step with H + I
    alone then flips the error's sign at constant size for ever (the cycle measured on 3 of 17
    tiny linear mocks); with Broyden's update the matrix learns the true derivative and the
    iteration reaches the root (for a linear F in n dimensions Broyden ends in at most 2n steps)."""
    from fli.infer.muse.estimator import _newton_matrix

    h = np.array([[2.4, 4.2], [4.2, 14.0]])
    a = 2 * (h + np.eye(2))
    root = np.array([0.3, -1.7])
    f_of = lambda th: -a @ (th - root)

    def iterate(update: bool, n: int = 8):
        th, b, prev = np.zeros(2), None, None
        for _ in range(n):
            f = f_of(th)
            b = _newton_matrix(h, b if update else None, prev, th, f)
            prev = (th, f)
            th = th + np.linalg.solve(b, f)
        return th

    plain = iterate(update=False)
    assert np.linalg.norm(plain - root) > 0.5 * np.linalg.norm(root)  # the cycle: no progress
    np.testing.assert_allclose(iterate(update=True), root, atol=1e-8)


# 155 s measured alone (3 fli-map runs with Laplace, mostly compiling; j_sims 8); 143 s beside two
# niced studies with the preconditioned fits, the compilation cache warm (2026-12-07). With the
# files' run (a fourth fli-map and a fli-muse-worker, sharing the one-process run as reference):
# 167 s beside two niced studies
@pytest.mark.slow(seconds=170)
@pytest.mark.multiprocess
def test_muse_spread_over_two_processes_gives_the_one_process_estimate(tmp_path):
    """``inference.map.muse.spread=processes``, and ``spread=files`` below: 2 fli-map processes
    (scripts/launch/local.py, jax.distributed over gloo, 1 CPU device each) share the simulations' fits, each on its own
    1-device mesh, and meet through their score files. The same config in 1 process of 1 device
    must give the same estimate and covariance. Each fit runs the same compiled program on the
    same inputs from the same start (the data and simulation i stay with one worker), so the
    scores agree bitwise, and only the JSON round trip of a float64 (exact) lies between them:
    1e-12 of the sd is a bound that any fit made from another start would break by orders of
    magnitude (the fits stop at a gradient RMS of 1e-4, not at round-off)."""
    import json
    import subprocess
    import sys

    from fli.cli.mock import main as mock_main
    from tests.helpers.processes import ROOT, child_env

    mock = tmp_path / "mock"
    assert mock_main([*LINEAR, f"run_dir={mock}"]) == 0
    # the joint MAP's Laplace step stays on: on 2 processes its program reads the observation,
    # whose arrays span both processes (a closure over them was refused; found by
    # scripts/bench/muse_spread.py)
    common = [*LINEAR, f"mock={mock}", "inference.map.steps=30", "inference.map.estimator=muse",
              "inference.map.muse.n_sims=5", "inference.map.muse.j_sims=8", "progress=false"]
    env = child_env(PYTHONUNBUFFERED="1")
    one = subprocess.run([sys.executable, "-m", "fli.cli.map", *common, f"run_dir={tmp_path / 'one'}",
                          "distributed.local_device_count=1"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert one.returncode == 0, one.stderr[-3000:]
    # spread=files: fli-map is worker 0 and fli-muse-worker worker 1, no jax.distributed between
    # them; started together, the worker waits for fli-map's config and preconditioner
    files = tmp_path / "files"
    worker0 = subprocess.Popen([sys.executable, "-m", "fli.cli.map", *common, f"run_dir={files}",
                                "distributed.local_device_count=1", "inference.map.muse.spread=files",
                                "inference.map.muse.workers=2"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    worker1 = subprocess.run([sys.executable, "-m", "fli.cli.muse_worker", str(files), "1", "--timeout", "600"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if worker1.returncode != 0:  # worker 0 would wait for its fits for ever
        worker0.kill()
    out0, _ = worker0.communicate(timeout=900)
    assert worker0.returncode == 0 and worker1.returncode == 0, (out0[-3000:], worker1.stderr[-3000:])
    assert "preconditioner read from" in worker1.stderr and "done after" in worker1.stderr, worker1.stderr[-2000:]
    mine = [json.loads(line)["name"] for line in (files / "muse_scores.p1.jsonl").read_text().splitlines()]
    assert mine and all(n.endswith(("/sim0", "/sim2", "/sim4", "/sim6")) for n in mine), mine[:6]
    two = subprocess.run([sys.executable, str(ROOT / "scripts" / "launch" / "local.py"), "-n", "2",
                          "--devices-per-process", "1", "--", sys.executable, "-m", "fli.cli.map", *common,
                          f"run_dir={tmp_path / 'two'}", "distributed.pdims=[1,2]",
                          "inference.map.muse.spread=processes"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert two.returncode == 0, (two.stdout[-3000:], two.stderr[-3000:])
    assert "MUSE: the fits spread over 2 processes, each on its own 1x1 mesh" in two.stdout + two.stderr
    maps = [json.loads((tmp_path / d / "map.json").read_text()) for d in ("one", "two", "files")]
    # the joint MAP ran on 1 device and on 2 devices of 2 processes: float32 sums in another order,
    # 30 steps; its Laplace widths agree to a percent (measured: 1e-3)
    for name, sd1 in maps[0]["laplace"]["marginal"]["std"].items():
        assert maps[1]["laplace"]["marginal"]["std"][name] == pytest.approx(sd1, rel=1e-2), name
    a, b, c = (m["muse"] for m in maps)
    assert a["converged"] and b["converged"] and a["iterations"] == b["iterations"]
    # both workers made fits: worker 1's file holds the even simulations, 0, 2, 4 of each stage and
    # 6 of J's at the last point (j_sims = 8)
    mine = [json.loads(line)["name"] for line in (tmp_path / "two" / "muse_scores.p1.jsonl").read_text().splitlines()]
    assert mine and all(n.endswith(("/sim0", "/sim2", "/sim4", "/sim6")) for n in mine), mine[:6]
    assert any(n.endswith("/sim6") for n in mine)
    sd = np.asarray(a["sd_z"])
    assert np.all(np.abs(np.asarray(a["theta_z"]) - b["theta_z"]) <= 1e-12 * sd), (a["theta_z"], b["theta_z"])
    assert np.allclose(a["cov_z"], b["cov_z"], rtol=1e-12, atol=0), (a["cov_z"], b["cov_z"])
    # the files' run: one process of one device, as "one", so its joint MAP is the same too
    assert c["converged"] and c["iterations"] == a["iterations"] and c["grad_evals"] == a["grad_evals"]
    assert np.all(np.abs(np.asarray(a["theta_z"]) - c["theta_z"]) <= 1e-12 * sd), (a["theta_z"], c["theta_z"])
    assert np.allclose(a["cov_z"], c["cov_z"], rtol=1e-12, atol=0), (a["cov_z"], c["cov_z"])
    assert c["grad_evals_this_run"] < 0.8 * c["grad_evals"]  # worker 1 made its share


def test_fli_muse_worker_refuses_a_run_it_cannot_join(tmp_path, capsys):
    """A run not spread over files, a worker number outside 1..workers-1, no such directory:
    one line naming what is wrong and what would do, exit status 2, nothing written."""
    import yaml

    from fli.cli.compose import compose
    from fli.cli.muse_worker import main

    for name, extra, want in (("mesh", ["inference.map.estimator=muse"], "inference.map.muse.spread=mesh"),
                              ("joint", [], "inference.map.estimator=joint"),
                              ("three", ["inference.map.estimator=muse", "inference.map.muse.spread=files",
                                         "inference.map.muse.workers=3"], "workers are 1 to 2")):
        run = tmp_path / name
        run.mkdir()
        _, resolved = compose([*LINEAR, *extra])
        (run / "config.yaml").write_text(yaml.safe_dump(resolved))
        (run / "fli-run.json").write_text("{}")  # what the worker waits for: fli-map has started
        assert main([str(run), "3", "--timeout", "60"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("fli-muse-worker: error: ") and want in err, err
        assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "fli-run.json"]
    assert main([str(tmp_path / "no" / "where"), "1"]) == 2
    assert "is not a directory and cannot become one" in capsys.readouterr().err
    # a run directory fli-map has not made yet is waited for (a job array may start its workers
    # first), up to --timeout
    assert main([str(tmp_path / "later"), "1", "--timeout", "0.5"]) == 2
    assert "did not appear within" in capsys.readouterr().err
    from fli.config import ConfigError

    with pytest.raises(ConfigError, match="inference.map.muse.workers"):
        compose([*LINEAR, "inference.map.muse.spread=files"])  # workers 1: files needs 2 or more


def test_each_process_mesh_divides_pdims_along_an_axis_the_process_count_divides():
    from fli.config import ConfigError
    from fli.infer.muse.run import local_pdims

    assert local_pdims([2, 2], 2) == (1, 2) and local_pdims([1, 4], 2) == (1, 2) and local_pdims([1, 2], 2) == (1, 1)
    assert local_pdims([4, 1], 4) == (1, 1) and local_pdims([1, 1], 1) == (1, 1)
    with pytest.raises(ConfigError, match=r"distributed.pdims \[1, 3\] among 2 processes"):
        local_pdims([1, 3], 2)


def test_the_bootstrap_passes_over_resamples_with_a_singular_j():
    """With few simulations some resamples repeat one or two of them, and their J is singular;
    the bootstrap draws again instead of failing (found running 5 simulations), and gives the
    spread of the others."""
    from fli.infer.muse.result import MuseResult, covariance

    # one parameter and 2 simulations: half the resamples repeat one simulation, and their J is 0
    g, cols = np.array([[0.3], [-1.2]]), np.array([[[2.0]], [[2.5]]])
    with pytest.raises(FloatingPointError, match="singular covariance J"):
        covariance(cols.mean(0), np.cov(g[[0, 0]].T).reshape(1, 1))
    r = MuseResult(("a",), np.zeros(1), np.eye(1), cols.mean(0), np.cov(g.T).reshape(1, 1), np.eye(1), g, g[0], cols,
                   [], True, 0, 0.0)
    sd = r.bootstrap_sd(n_boot=50)
    assert np.all(np.isfinite(sd)) and np.all(sd > 0), sd
    # two parameters and 3 simulations: a resample of 2 distinct ones leaves J singular only to
    # round-off, where the solve passes and H^T J^-1 H + I comes out indefinite (NaN sds, seen
    # with 5 simulations)
    rng = np.random.default_rng(1)
    g, cols = rng.standard_normal((3, 2)), 3 * np.eye(2) + 0.1 * rng.standard_normal((3, 2, 2))
    r = MuseResult(("a", "b"), np.zeros(2), np.eye(2), cols.mean(0), np.cov(g.T), np.eye(2), g, g[0], cols,
                   [], True, 0, 0.0)
    sd = r.bootstrap_sd(n_boot=50)
    assert np.all(np.isfinite(sd)) and np.all(sd > 0), sd


def test_a_diagonal_of_h_within_two_standard_errors_of_zero_is_reported_unresolved():
    """H's Monte Carlo se is the columns' sd over sqrt(N), and a parameter whose diagonal is not
    above 2 se is named (tiny PM with fits ended by their budget gave Omega_c -0.38 +- 0.4)."""
    from fli.infer.muse.result import MuseResult

    rng = np.random.default_rng(3)
    n = 16
    cols = np.empty((n, 2, 2))
    cols[:, 0, 0] = 3.0 + 0.1 * rng.standard_normal(n)  # well measured: 3 +- 0.025
    cols[:, 1, 1] = 0.4 * rng.standard_normal(n)  # noise about 0: the response not resolved
    cols[:, 0, 1] = cols[:, 1, 0] = 0.2 * rng.standard_normal(n)
    g = rng.standard_normal((n, 2))
    result = lambda cols: MuseResult(("a", "b"), np.zeros(2), np.eye(2), cols.mean(0), np.cov(g.T), np.eye(2), g, g[0],
                                     cols, [], True, 0, 0.0)
    r = result(cols)
    np.testing.assert_allclose(r.h_se[1, 1], np.std(cols[:, 1, 1], ddof=1) / 4)
    assert r.unresolved() == ["b"]
    cols[:, 1, 1] += 1.0  # 1 +- 0.1: now resolved
    assert result(cols).unresolved() == []


def test_the_smoothness_probe_tells_a_quadratic_potential_from_one_with_a_kink(linear):
    """scripts/studies/field_fit_smoothness.py's probe (docs/muse_studies.md: the PM potential has kinks where its
    field fits end). On the linear forward U is quadratic in s, so phi'(t) along any line is
    exactly straight: every step between neighbouring points is the same. The same U with a kink
    |e . (s - s_hat)| planted across the line must show one jump far above the others."""
    from tests.helpers.scripts import load_script

    mod = load_script("studies/field_fit_smoothness")
    _, post, data, theta = linear
    th = jnp.asarray(theta, post.fwd.grid.jdtype)
    s_hat = jnp.asarray(_exact_map(post, data, theta), post.fwd.grid.jdtype)
    e = jax.random.normal(jax.random.key(2), s_hat.shape, s_hat.dtype)
    e = e / jnp.linalg.norm(e)
    s = s_hat + 3e-4 * e  # off the minimum, so the descent direction is defined (about -e)
    smooth = mod.line(post, data, th, s, [1e-3], 21)["0.001"]
    steps = np.diff(smooth["dphi"])
    # float32 round-off of phi' (values of a few units) is ~1e-6; the steps are ~curvature x 1e-4
    assert np.ptp(steps) < 0.05 * np.abs(steps).mean(), steps
    kinked = SimpleNamespace(potential=lambda lat, d: post.potential(lat, d)
                             + 5.0 * jnp.abs(jnp.vdot(e, lat.s - s_hat)))
    k = mod.line(kinked, data, th, s, [1e-3], 21)["0.001"]
    assert k["largest_jump"] > 20 * k["median_jump"], (k["largest_jump"], k["median_jump"])
    assert smooth["largest_jump"] < 1.1 * smooth["median_jump"]
