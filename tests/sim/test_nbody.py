"""Forward model: layouts, conservation, reversibility, gradients, adjoints, physics limits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fli.cosmo.background import growth_factor, planck18
from fli.sim.fft import cic_compensation, force_correction_kernel, lattice_cic_response
from fli.sim.grid import Grid
from fli.sim.lpt import linear_field, linear_modes, lpt
from fli.sim.nbody import (
    PMState,
    _step,
    _unstep,
    check_scale_factors,
    density,
    initial_state,
    simulate,
    step_coefficients,
)
from fli.sim.power import power_spectrum
from fli.sim.sharding import make_mesh, white_noise
from tests.helpers.physics import LAYOUTS

SHAPE, BOX = (16, 16, 24), (320.0, 320.0, 480.0)  # non-cubic mesh and box
A_STEPS = np.linspace(0.1, 1.0, 6)


def _run(pdims, adjoint="checkpoint", dtype="float32", shape=SHAPE, box=BOX, a_steps=A_STEPS, halo=2):
    grid = Grid(shape, box, make_mesh(pdims), halo=halo, dtype=dtype)
    noise = white_noise(3, shape, grid.mesh, dtype=grid.jdtype)
    cosmo = jax.tree.map(lambda v: jnp.asarray(v, grid.jdtype), planck18())
    st, _, maxd = jax.jit(lambda c, s: simulate(c, s, grid, a_steps, adjoint=adjoint))(cosmo, noise)
    return grid, st, density(st.disp, grid), maxd


@pytest.mark.slow(seconds=25)  # layout invariance of the mock stays in the default set
def test_final_density_identical_on_every_layout():
    _, _, ref, _ = _run((1, 1))
    ref = np.asarray(ref)
    for pd in LAYOUTS[1:]:
        _, _, rho, _ = _run(pd)
        # float32: FFT sums in different orders on different layouts -> rounding ~1e-6 relative
        np.testing.assert_allclose(np.asarray(rho), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_mass_conserved_and_halo_respected():
    grid, st, rho, maxd = _run((2, 2))
    # CIC weights sum to one per particle: total mass exact up to float32 summation rounding
    assert abs(float(jnp.sum(rho)) - grid.n_cells) < 1e-4 * grid.n_cells
    assert np.all(np.asarray(maxd) < grid.halo)
    assert np.all(np.diff(np.asarray(maxd)) >= -1e-6)  # displacements grow monotonically here


def test_leapfrog_reverses_exactly():
    """Run forward then backwards with the exact inverse step; float64 returns to 1e-8."""
    with jax.enable_x64(True):
        grid = Grid(SHAPE, BOX, make_mesh((2, 2)), halo=2, dtype="float64")
        cosmo = jax.tree.map(lambda v: jnp.asarray(v, jnp.float64), planck18())
        s = white_noise(3, SHAPE, grid.mesh, dtype=jnp.float64)
        coeffs = step_coefficients(cosmo, jnp.asarray(A_STEPS))

        @jax.jit
        def there_and_back(cosmo, s):
            st0 = initial_state(cosmo, s, grid, A_STEPS[0])
            st = st0
            for i in range(len(A_STEPS) - 1):
                c = jax.tree.map(lambda v: v[i], coeffs)
                st, _ = _step(cosmo, st, c, grid, None, i)
            for i in reversed(range(len(A_STEPS) - 1)):
                c = jax.tree.map(lambda v: v[i], coeffs)
                st = _unstep(cosmo, st, c, grid)
            return st0, st

        st0, back = there_and_back(cosmo, s)
        scale = float(jnp.max(jnp.abs(st0.disp)))
        err = float(jnp.max(jnp.abs(back.disp - st0.disp))) / scale
        assert err < 1e-8, err


def _loss_fn(grid, a_steps, adjoint):
    w = white_noise(11, grid.shape, grid.mesh, dtype=grid.jdtype)

    def loss(omega_c, sigma8, s):
        cosmo = planck18().replace(Omega_c=omega_c, sigma8=sigma8)
        cosmo = jax.tree.map(lambda v: jnp.asarray(v, grid.jdtype), cosmo)
        st, _, _ = simulate(cosmo, s, grid, a_steps, adjoint=adjoint)
        return jnp.sum(density(st.disp, grid) * w)

    return loss


@pytest.mark.slow(seconds=20)  # the FD test of kappa through PM (test_lensing_forward) stays default
@pytest.mark.parametrize("adjoint", ["checkpoint", "reversible"])
def test_gradients_match_finite_differences(adjoint):
    with jax.enable_x64(True):
        shape, box = (8, 8, 12), (200.0, 200.0, 300.0)
        grid = Grid(shape, box, make_mesh((2, 2)), halo=2, dtype="float64")
        a_steps = np.linspace(0.2, 1.0, 4)
        loss = _loss_fn(grid, a_steps, adjoint)
        s = white_noise(5, shape, grid.mesh, dtype=jnp.float64)
        oc, s8 = 0.2607, 0.8102
        g_oc, g_s8, g_s = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(oc, s8, s)
        f = jax.jit(loss)
        eps = 1e-5  # central differences: truncation O(eps^2), rounding 1e-16/eps: ~1e-9 relative
        fd_oc = (f(oc + eps, s8, s) - f(oc - eps, s8, s)) / (2 * eps)
        fd_s8 = (f(oc, s8 + eps, s) - f(oc, s8 - eps, s)) / (2 * eps)
        v = white_noise(9, shape, grid.mesh, dtype=jnp.float64)
        fd_s = (f(oc, s8, s + eps * v) - f(oc, s8, s - eps * v)) / (2 * eps)
        # CIC is piecewise linear: a particle crossing a cell edge within +-eps makes FD
        # slightly off; with eps=1e-5 that is rare, so 1e-4 relative leaves margin
        np.testing.assert_allclose(float(g_oc), float(fd_oc), rtol=1e-4)
        np.testing.assert_allclose(float(g_s8), float(fd_s8), rtol=1e-4)
        np.testing.assert_allclose(float(jnp.sum(g_s * v)), float(fd_s), rtol=1e-4)


@pytest.mark.slow(seconds=30)
def test_reversible_adjoint_matches_autodiff_float64():
    with jax.enable_x64(True):
        shape, box = (8, 8, 12), (200.0, 200.0, 300.0)
        grid = Grid(shape, box, make_mesh((1, 2)), halo=2, dtype="float64")
        a_steps = np.linspace(0.1, 1.0, 6)
        s = white_noise(5, shape, grid.mesh, dtype=jnp.float64)
        ga = jax.jit(jax.grad(_loss_fn(grid, a_steps, "checkpoint"), argnums=(0, 1, 2)))(0.26, 0.81, s)
        gb = jax.jit(jax.grad(_loss_fn(grid, a_steps, "reversible"), argnums=(0, 1, 2)))(0.26, 0.81, s)
        for a, b in zip(ga, gb, strict=False):
            # the reversible adjoint recomputes states by running backwards: in float64 the
            # reconstruction error is ~1e-12, far inside the 1e-4 the issue asks for
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-4 * np.abs(a).max())


@pytest.mark.slow(seconds=10)
def test_lpt_matches_linear_theory_at_early_times():
    """2LPT particles painted at a = 0.02 give D^2 P_lin once the lattice response is removed."""
    grid = Grid((32, 32, 32), (500.0,) * 3, make_mesh((2, 2)), halo=2)
    cosmo = planck18()
    s = white_noise(0, grid.shape, grid.mesh)
    a = 0.02
    disp, _ = lpt(cosmo, linear_modes(cosmo, s, grid), grid, a, order=2)
    delta = density(disp, grid) - 1.0
    plan = grid.fft
    resp = lattice_cic_response(plan, grid.box)
    k, p_raw, _ = power_spectrum(delta, plan, grid.box)
    _, p_cor, _ = power_spectrum(plan.irfft(plan.rfft(delta) / resp), plan, grid.box)
    _, p_lin, _ = power_spectrum(linear_field(cosmo, s, grid, a), plan, grid.box)
    sel = np.asarray(k) < 0.3 * np.pi / float(grid.cell[0])  # below 0.3 k_Nyquist
    raw, cor = np.asarray(p_raw / p_lin)[sel], np.asarray(p_cor / p_lin)[sel]
    # same realisation, so no cosmic variance. R is the linear part of CIC painting; its
    # upwind part (first order in |Psi|, not in Psi) adds power ~(k h)^2 that R does not
    # model: measured 0.3-2.4% below 0.3 k_Nyq, hence 3%. 2LPT terms at a = 0.02 are ~1e-3.
    assert np.all(np.abs(cor - 1) < 0.03), cor
    # the raw painted field is suppressed by R^2 (10% at 0.3 k_Nyq): the correction is needed
    assert raw[-1] < 0.95 and np.all(raw < 1), raw


def _growth_ratios(seeds, force_correction):
    """P / (D^2 P_lin) of the same realisations, k < 0.03 h/Mpc, after 2LPT + 10 PM steps
    (a = 0.1 -> 1) at 64^3 in 1000 Mpc/h. The painted field's CIC window is divided out (the
    standard mass-assignment compensation of a P(k) estimator)."""
    grid = Grid((64, 64, 64), (1000.0,) * 3, make_mesh((1, 2)), halo=4, force_correction=force_correction)
    cosmo, plan = planck18(), grid.fft
    run = jax.jit(lambda c, s: simulate(c, s, grid, np.linspace(0.1, 1, 11)))
    out = []
    for seed in seeds:
        s = white_noise(seed, grid.shape, grid.mesh)
        st, _, maxd = run(cosmo, s)
        assert float(np.max(np.asarray(maxd))) < grid.halo
        delta = plan.irfft(plan.rfft(density(st.disp, grid) - 1.0) * cic_compensation(plan))
        k, p, _ = power_spectrum(delta, plan, grid.box)
        _, p_lin, _ = power_spectrum(linear_field(cosmo, s, grid, 1.0), plan, grid.box)
        out.append(np.asarray(p / p_lin)[np.asarray(k) < 0.03])
    return np.array(out)  # [seed, bin]: k = 0.008, 0.014, 0.020, 0.026 h/Mpc


@pytest.mark.slow(seconds=20)
def test_pm_growth_large_scales_64():
    """The forward-model issue's growth target: 1 within 2% for k < 0.03 h/Mpc."""
    ratios = _growth_ratios(range(4), 0.25)
    # Same realisation, so the Gaussian cosmic variance cancels, but not the nonlinear terms:
    # a single seed's <delta_1 delta_2>-type cross terms scatter each bin by ~1-3% (measured
    # 0.978-1.030 over 4 seeds; means 1.001 1.003 0.994 1.005). The mean over 4 seeds is held
    # to the 2% target; a single seed to 4%.
    mean = ratios.mean(axis=0)
    assert np.all(np.abs(mean - 1) < 0.02), ratios
    assert np.all(np.abs(ratios - 1) < 0.04), ratios
    # without the resolution correction the PM force is ~(k h)^2 / 4 short and the growth
    # falls behind (measured 0.937 at k = 0.026 for seed 0): the correction is what passes
    plain = _growth_ratios([0], 0.0)
    assert plain[0, -1] < 0.96 < ratios[0, -1], (plain, ratios)


def test_force_correction_kernel():
    grid = Grid((8, 12, 16), (80.0, 60.0, 160.0), make_mesh((1, 1)))
    plan = grid.fft
    kern = np.broadcast_to(np.asarray(force_correction_kernel(plan, grid.box, 0.25)), plan.kshape)
    kx, ky, kz = (np.broadcast_to(np.asarray(k), plan.kshape) for k in plan.kvec(grid.box))
    h = grid.cell
    s = (kx * h[0]) ** 2 + (ky * h[1]) ** 2 + (kz * h[2]) ** 2
    np.testing.assert_allclose(kern, 1 + 0.25 * s / (1 + s**2), rtol=1e-6)
    assert kern[0, 0, 0] == 1.0
    # leading order (k h)^2 / 4 at small k h; bounded by 1 + 1/8 everywhere (the taper)
    small = s < 0.05
    np.testing.assert_allclose(kern[small], 1 + 0.25 * s[small], rtol=3e-3)
    assert kern.max() <= 1.125 + 1e-6
    with pytest.raises(ValueError, match="force_correction must be a finite number >= 0"):
        Grid((8, 8, 8), (100.0,) * 3, make_mesh((1, 1)), force_correction=-0.1)


def test_the_config_mass_assignment_reaches_the_pm():
    """simulation.assignment travels config -> Grid -> the PM's paint and read: the density is
    painting.paint's in that scheme, and the force follows it (TSC's differs from CIC's)."""
    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.forward import build_forward  # noqa: PLC0415
    from fli.sim.nbody import pm_force  # noqa: PLC0415
    from fli.sim.painting import paint  # noqa: PLC0415

    assert build_forward(compose(["experiment=tiny", "simulation.assignment=tsc"])[0]).grid.assignment == "tsc"
    grids = {sc: Grid(SHAPE, BOX, make_mesh((1, 2)), halo=2, assignment=sc) for sc in ("cic", "tsc")}
    rng = np.random.default_rng(0)
    cell = np.asarray(grids["cic"].cell)
    disp = jnp.asarray(rng.uniform(-1.4, 1.4, SHAPE + (3,)) * cell, jnp.float32)
    force = {}
    for sc, grid in grids.items():
        rho = density(disp, grid)
        np.testing.assert_array_equal(np.asarray(rho), np.asarray(paint(disp / cell, grid.mesh, 2, scheme=sc)))
        force[sc] = np.asarray(pm_force(planck18(), disp, grid)[0])
    assert not np.allclose(force["cic"], force["tsc"], rtol=1e-3)
    # TSC's wider read: the correction's coefficient scaled by (1/6 + 1/8) / (1/6 + 1/12) = 7/6
    assert grids["cic"].force_coefficient == 0.25
    assert grids["tsc"].force_coefficient == pytest.approx(7 / 24, rel=1e-12)
    with pytest.raises(ValueError, match="mass assignment must be one of"):
        Grid(SHAPE, BOX, make_mesh((1, 1)), assignment="pcs")


def test_bad_input_is_refused_before_compiling():
    with pytest.raises(ValueError, match="must increase"):
        check_scale_factors([0.1, 0.5, 0.4])
    with pytest.raises(ValueError, match="finite"):
        check_scale_factors([0.1, np.nan])
    with pytest.raises(ValueError, match="not divisible by pdims"):
        Grid((10, 16, 16), (100.0,) * 3, make_mesh((4, 2)))
    with pytest.raises(ValueError, match="halo 9 must be between 1 and the local block size 8"):
        Grid((16, 16, 16), (100.0,) * 3, make_mesh((2, 2)), halo=9)
    grid = Grid((8, 8, 8), (100.0,) * 3, make_mesh((1, 1)))
    s = white_noise(0, grid.shape, grid.mesh)
    with pytest.raises(ValueError, match="must increase"):
        simulate(planck18(), s, grid, [0.1, 0.5, 0.3])
    with pytest.raises(ValueError, match="Omega_c"):
        simulate(planck18().replace(Omega_c=float("nan")), s, grid, [0.1, 1.0])
    with pytest.raises(ValueError, match="white noise has shape"):
        simulate(planck18(), s[:4], grid, [0.1, 1.0])
    with pytest.raises(ValueError, match="box must be three positive"):
        Grid((16, 16, 16), (100.0, -1.0, 100.0), make_mesh((1, 1)))


def test_state_is_a_pytree():
    leaves = jax.tree.leaves(PMState(jnp.zeros(1), jnp.ones(1), jnp.zeros(1)))
    assert len(leaves) == 3
    assert float(growth_factor(planck18(), 1.0)) == pytest.approx(1.0, abs=1e-6)
