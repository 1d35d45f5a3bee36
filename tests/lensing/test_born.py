"""Tests of fli.lensing.born: geometry and validation, the PM plane hook, the Born projection
(analytic patterns, layout independence, gradients), n(z) and lensing efficiency, Limber
C_ell against CCL (pyccl), shape noise and the map power spectrum.

Small setting used throughout: a 16 x 16 x 32 mesh in a 1000 x 1000 x 4000 (Mpc/h)^3 box cut
into 8 slabs (dr = 500 Mpc/h, 4 cells each); sources up to z = 1.6 (chi ~ 3157 Mpc/h) so 7
planes are used; a 5 deg map of 16 x 16 pixels (divisible by every layout).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fli.lensing import born as L
from fli.lensing import limber as LB
from fli.lensing import survey as SV
from fli.config import LensingConfig, NzBinConfig, SurveyConfig
from fli.cosmo.background import comoving_distance, planck18
from fli.sim.grid import Grid
from fli.lensing.light_cone import _host_chi_of_z
from fli.sim.nbody import Density
from fli.sim.sharding import make_mesh
from tests.helpers.physics import LAYOUTS, ccl_cosmology

COSMO = planck18()
SHAPE, BOX = (16, 16, 32), (1000.0, 1000.0, 4000.0)
N_PLANES, FOV, NPIX, ZMAX = 8, 5.0, 16, 1.6
BINS = [SV.smail_bin(0.4, 2.0, 1.5, 0.2, 0.8, n_gal=10.0, label="b0"),
        SV.smail_bin(0.8, 2.0, 1.5, 0.8, 1.6, n_gal=5.0, label="b1")]


@pytest.fixture(scope="module")
def geom():
    return L.LensGeometry.create(COSMO, BOX, SHAPE, N_PLANES, FOV, NPIX, ZMAX)


def test_host_numbers_in_float64_on_the_cpu():
    """The light cone's host-side distances run under fli.sim.host.cpu_float64: float64, on the CPU
    device (an accelerator's float64 is emulated, slow to compile), x64 off again afterwards."""
    from fli.sim.host import cpu_float64

    with cpu_float64():
        x = jnp.arange(3, dtype=jnp.float64) + 1e-12
    assert x.dtype == jnp.float64 and {d.platform for d in x.devices()} == {"cpu"}
    assert jnp.ones(1).dtype == jnp.float32
    chi = _host_chi_of_z(COSMO, np.array([0.5, 1.0]))
    assert chi.dtype == np.float64
    # float64 resolves a 1e-9 change of z in chi; float32 (7 digits) would not
    assert _host_chi_of_z(COSMO, np.array([0.5 + 1e-9]))[0] > chi[0]


def grid_for(pdims):
    return Grid(SHAPE, BOX, make_mesh(pdims), halo=1)


def host_cosmo():
    return jax.tree_util.tree_map(np.float64, COSMO)


# ------------------------------------------------------------------------------ geometry


def test_geometry_planes_times_and_steps(geom):
    assert (geom.dr, geom.slab_cells, geom.n_used) == (500.0, 4, 7)
    np.testing.assert_allclose(geom.plane_r, 250.0 + 500.0 * np.arange(7))
    # the last used plane starts (r - dr/2 = 3000) before chi(z = 1.6) ~ 3157 Mpc/h
    assert geom.plane_r[-1] - geom.dr / 2 < geom.chi_source_max < geom.plane_r[-1] + geom.dr / 2
    with jax.enable_x64(True):  # a_i really is the crossing time of r_i
        chi = np.asarray(jax.jit(comoving_distance)(host_cosmo(), geom.plane_a))
    np.testing.assert_allclose(chi, geom.plane_r, rtol=1e-6)
    steps = geom.a_steps(0.1)
    assert steps.shape == (8,) and steps[0] == 0.1 and np.all(np.diff(steps) > 0)
    np.testing.assert_array_equal(steps[1:], geom.plane_a[::-1])
    # traced version (a_of_chi of any cosmology; float32 here), used with fiducial-free steps
    np.testing.assert_allclose(np.asarray(jax.jit(geom.a_steps)(0.1, COSMO)), steps, rtol=1e-5)
    assert geom.plane_index(0) == 6 and geom.plane_index(6) == 0 and geom.step_of_plane(6) == 0
    with pytest.raises(ValueError, match=r"simulation.a_start = 0.5 must be in \(0, 0.373"):
        geom.a_steps(0.5)
    # static under jit: hashable, equal when rebuilt
    again = L.LensGeometry.create(COSMO, BOX, SHAPE, N_PLANES, FOV, NPIX, ZMAX)
    assert again == geom and hash(again) == hash(geom)
    assert geom.pixel_area_arcmin2 == pytest.approx((5 * 60 / 16) ** 2)
    assert "no replication" in geom.replication_note()


def test_geometry_from_config_and_validation_errors():
    grid = grid_for((2, 4))
    lens, survey = LensingConfig(fov_deg=FOV, npix=NPIX, n_planes=N_PLANES), SurveyConfig()
    g = L.lens_geometry(COSMO, grid, lens, survey)  # default survey: bins up to z = 1.6
    assert g.n_used == 7 and g.pdims == (2, 4) and g.z_source_max == pytest.approx(1.6)
    create = L.LensGeometry.create
    with pytest.raises(ValueError, match=r"^lensing.n_planes = 8 must divide simulation.mesh\[2\] = 30"):
        create(COSMO, BOX, (16, 16, 30), 8, FOV, NPIX, ZMAX)
    with pytest.raises(ValueError, match=r"^simulation.box\[2\] = 2000 Mpc/h must be >= chi\(z_max = 1.6\)"):
        create(COSMO, (1000, 1000, 2000), SHAPE, 8, FOV, NPIX, ZMAX)
    with pytest.raises(ValueError, match=r"^lensing.npix = 12 must be divisible by .*pdims \(8, 1\)"):
        create(COSMO, BOX, SHAPE, 8, FOV, 12, ZMAX, pdims=(8, 1))
    with pytest.raises(ValueError, match=r"lensing.npix = 12"):
        L.lens_geometry(COSMO, grid_for((1, 8)), dataclasses.replace(lens, npix=12), survey)
    # 25 deg at r = 3250 Mpc/h spans 1418 Mpc/h > 1000 Mpc/h: the map would see structures twice
    with pytest.raises(ValueError, match=r"^lensing.fov_deg = 25 deg spans 1418.1 Mpc/h .*"
                                         r"lensing.allow_replication = true$"):
        create(COSMO, BOX, SHAPE, 8, 25.0, NPIX, ZMAX)
    with pytest.warns(L.ReplicationWarning, match=r"beyond r = 2291.8 Mpc/h the field of view"):
        g = create(COSMO, BOX, SHAPE, 8, 25.0, NPIX, ZMAX, allow_replication=True)
    assert g.replicated and g.r_replication == pytest.approx(1000 / np.radians(25))
    assert "transverse modes > L are replicated" in g.replication_note()
    # the error messages are one line
    try:
        create(COSMO, BOX, SHAPE, 8, 25.0, NPIX, ZMAX)
    except ValueError as e:
        assert "\n" not in str(e)


@pytest.mark.parametrize("z, nz, match", [
    ([0.5, 1.0, 1.5], [1.0, -0.1, 1.0], "n\\(z\\) must be >= 0"),
    ([0.5, 1.0, 1.5], [0.0, 0.0, 0.0], "integrates to 0"),
    ([0.5, 1.5, 1.0], [1.0, 1.0, 1.0], "strictly increasing"),
    ([0.5, 1.0, 1.5], [1.0, np.nan, 1.0], "non-finite"),
])
def test_nz_table_validation_names_the_bin(z, nz, match):
    survey = SurveyConfig(bins=[NzBinConfig(), NzBinConfig(kind="table", z=z, nz=nz)])
    with pytest.raises(ValueError, match=rf"^survey.bins\[1\]: .*{match}"):
        SV.nz_bins_from_config(survey)


def test_nz_from_config_is_normalised():
    survey = SurveyConfig(bins=[NzBinConfig(z0=0.4, z_min=0.2, z_max=0.8),
                                NzBinConfig(kind="table", z=[0.5, 1.0, 1.5], nz=[0.0, 2.0, 0.0])])
    b0, b1 = SV.nz_bins_from_config(survey)
    for b in (b0, b1):
        assert np.trapezoid(b.nz, b.z) == pytest.approx(1.0, rel=1e-12) and np.all(b.nz >= 0)
    assert b0.z[0] == 0.2 and b0.z_max == pytest.approx(0.8) and b1.z_mean == pytest.approx(1.0, abs=1e-3)
    assert b1.label == "survey.bins[1]" and b1.n_gal == 10.0


# ------------------------------------------------------------------------------ efficiency / theory


def test_lensing_efficiency_single_source_plane():
    """A source slice 1 +- 0.001 behaves like one source plane: g = (chi_s - chi)/chi_s.

    g is an average of max(0, 1 - chi/chi(z)) over the slice, so it differs from the
    single-plane value by at most chi * max|1/chi(z) - 1/chi_s| <= (chi_max - chi_min)/chi_s.
    """
    with jax.enable_x64(True):
        c = host_cosmo()
        b = SV.table_bin([0.999, 1.001], [1.0, 1.0], label="thin")
        z3 = np.array([0.999, 1.0, 1.001])
        chi_lo, chi_s, chi_hi = np.asarray(jax.jit(comoving_distance)(c, 1 / (1 + z3)))
        chi = np.linspace(0.0, 1.2 * chi_s, 61)
        g = np.asarray(L.lensing_efficiency(c, b, chi))
    tol = (chi_hi - chi_lo) / chi_s  # ~1e-3
    np.testing.assert_allclose(g, np.maximum(0.0, 1.0 - chi / chi_s), rtol=0, atol=tol)
    assert g[0] == pytest.approx(1.0, abs=1e-12) and np.all(g[chi > chi_hi] == 0)


ELL = np.geomspace(20.0, 2000.0, 10)


@pytest.fixture(scope="module")
def theory():
    """Limber C_ell (curved-sky k = (ell+1/2)/chi and flat-sky k = ell/chi) and the 64-plane
    sum prediction, float64, in one compiled call (compiling the cosmology dominates)."""
    with jax.enable_x64(True):
        c = host_cosmo()
        g64 = L.LensGeometry.create(c, (1000, 1000, 4096), (16, 16, 1024), 64, FOV, NPIX, ZMAX)

        @jax.jit
        def run(c):
            return (LB.limber_cl(c, BINS, ELL), LB.limber_cl(c, BINS, ELL, flat_sky=True),
                    LB.limber_cl_planes(c, BINS, ELL, g64, nyquist_cut=False))

        return tuple(np.asarray(x) for x in run(c))


def test_limber_cl_matches_ccl(theory):
    """Limber C_ell of kappa vs CCL's WeakLensingTracer, same n(z) tables and linear EH P(k).

    CCL is set up like fli (the same radiation, no massive neutrinos, T_CMB in the EH fit), so both
    compute the same integral; CCL's shear C_ell carries (l+2)(l+1)l(l-1)/(l+1/2)^4, divided
    out here (fli's kappa Limber has no ell prefactor).  Measured max |ratio - 1| = 1.5e-4
    (from CCL's splines of the kernel and P(k) and the two quadratures); 1e-3 keeps a margin
    and is 10x tighter than the 1-2% aim.
    """
    pyccl = pytest.importorskip("pyccl")
    cl = theory[0]
    c = host_cosmo()
    cc = ccl_cosmology(c)
    tr = [pyccl.WeakLensingTracer(cc, dndz=(np.asarray(b.z), np.asarray(b.nz))) for b in BINS]
    ell = ELL
    fac = (ell + 2) * (ell + 1) * ell * (ell - 1) / (ell + 0.5) ** 4
    for a in range(2):
        for b in range(2):
            ref = pyccl.angular_cl(cc, tr[a], tr[b], ell) / fac
            np.testing.assert_allclose(cl[a, b], ref, rtol=1e-3, err_msg=f"bins {a}{b}")
    np.testing.assert_allclose(cl[0, 1], cl[1, 0], rtol=1e-12)


def test_plane_sum_prediction_converges_to_limber(theory):
    """The thin-slab plane sum is a midpoint rule of the flat-sky Limber integral: with 64
    planes (dr = 64 Mpc/h) measured within 0.2%; 0.5% allowed.  Flat vs curved sky differ by
    the shift ell -> ell + 1/2 (a few % at ell = 20, nothing at high ell)."""
    cl, flat, planes = theory
    np.testing.assert_allclose(planes, flat, rtol=5e-3)
    assert np.all(np.abs(flat[..., -1] / cl[..., -1] - 1) < 1e-3)
    d20 = np.abs(flat[..., 0] / cl[..., 0] - 1)  # measured 2.1% for the auto spectrum of bin 0
    assert np.all((d20 > 5e-3) & (d20 < 0.05))


# ------------------------------------------------------------------------------ lens planes


def test_plane_hook_extracts_the_slabs(geom):
    rng = np.random.default_rng(1)
    dens = (2.0 * rng.random(SHAPE)).astype(np.float32)
    n, m, dz = geom.n_used, geom.slab_cells, BOX[2] / SHAPE[2]
    ref = np.stack([(dens[:, :, i * m:(i + 1) * m] - 1.0).sum(-1) * dz for i in range(n)])  # near first
    for pd in [(1, 1), (2, 4), (8, 1)]:
        grid = grid_for(pd)
        hook = L.plane_hook(geom, grid)
        rho = jax.device_put(dens, grid.sharding)

        @jax.jit
        def run(rho):  # as in fli.sim.nbody: hook(density, disp, a, step) in a scan over steps
            def body(carry, j):
                return carry, hook(Density(rho, None, None), None, 1.0, j)
            return jax.lax.scan(body, 0, jnp.arange(n))[1]

        planes = run(rho)
        assert planes.shape == (n, 16, 16)
        np.testing.assert_allclose(np.asarray(planes), ref[::-1], rtol=0, atol=1e-4)  # farthest first
        single = hook(Density(rho, None, None), None, 1.0, 2)
        assert single.sharding.is_equivalent_to(grid.sharding, 2)
        np.testing.assert_allclose(np.asarray(single), ref[geom.plane_index(2)], atol=1e-4)


def test_projection_reads_planes_at_theta_r(geom):
    """Planes holding the grid coordinate are interpolated exactly (bilinear is exact for
    linear functions; no wrap here since fov r_max < L/2), so each pixel returns the grid
    coordinate (L/2 + theta r_i) / cell of its centre, along x and along y."""
    grid = grid_for((2, 4))
    i = np.arange(16, dtype=np.float32)
    px = np.broadcast_to(i[None, :, None], (7, 16, 16))  # value = x index
    py = np.broadcast_to(i[None, None, :], (7, 16, 16))  # value = y index
    ux = (BOX[0] / 2 + geom.theta[None, :] * geom.plane_r[:, None]) / (BOX[0] / 16)  # [plane, pix]
    for planes, axis in ((px, 1), (py, 2)):
        proj = np.asarray(L.project_planes(jnp.asarray(planes), geom, grid, order="near_first"))
        want = np.expand_dims(ux, 3 - axis)
        np.testing.assert_allclose(proj, np.broadcast_to(want, proj.shape), rtol=0, atol=2e-5)
        steps = np.asarray(L.project_planes(jnp.asarray(planes[::-1]), geom, grid))  # default order
        np.testing.assert_allclose(steps[::-1], proj, atol=0)


def test_projection_of_plane_wave_with_periodic_wrap():
    """cos(2 pi X / Lx) on the grid, read at X = Lx/2 + theta r on a 25 deg map that wraps
    (replication allowed): bilinear error <= (cell k)^2 / 8 = 0.019 for 16 cells per period."""
    with pytest.warns(L.ReplicationWarning):
        g = L.LensGeometry.create(COSMO, BOX, SHAPE, N_PLANES, 25.0, NPIX, ZMAX, allow_replication=True)
    grid = grid_for((2, 2))
    k = 2 * np.pi / BOX[0]
    xg = np.arange(16) * BOX[0] / 16
    wave = np.cos(k * xg).astype(np.float32)
    planes = np.broadcast_to(wave[None, None, :], (7, 16, 16))  # along y
    proj = np.asarray(L.project_planes(jnp.asarray(planes), g, grid, order="near_first"))
    Y = BOX[1] / 2 + g.theta[None, :] * g.plane_r[:, None]  # [plane, pix_y]; exceeds [0, Ly)
    assert Y.max() > BOX[1] and Y.min() < 0
    want = np.broadcast_to(np.cos(k * Y)[:, None, :], proj.shape)
    assert np.max(np.abs(proj - want)) < (k * BOX[0] / 16) ** 2 / 8


def _random_planes(seed, dtype=np.float32):
    return np.random.default_rng(seed).normal(size=(7, 16, 16)).astype(dtype)


def test_born_convergence_identical_on_every_layout(geom):
    planes = _random_planes(2)
    ref = None
    for pd in LAYOUTS:
        grid = grid_for(pd)
        pl = jax.device_put(planes, jax.sharding.NamedSharding(grid.mesh, L.KAPPA_SPEC))
        k = L.born_convergence(COSMO, pl, geom, grid, BINS)
        assert k.shape == (2, NPIX, NPIX) and k.dtype == np.float32
        assert k.sharding.is_equivalent_to(jax.sharding.NamedSharding(grid.mesh, L.KAPPA_SPEC), 3)
        k = np.asarray(k)
        if ref is None:
            ref = k
        np.testing.assert_allclose(k, ref, rtol=0, atol=1e-5 * np.abs(ref).max(), err_msg=str(pd))
    # uniform planes: kappa_b = sum_i q_b(r_i) c_i everywhere, c_i = step index + 1
    grid = grid_for((2, 4))
    c_steps = np.arange(1, 8, dtype=np.float32)
    uniform = jnp.asarray(np.broadcast_to(c_steps[:, None, None], (7, 16, 16)))
    k = np.asarray(L.born_convergence(COSMO, uniform, geom, grid, BINS))
    w = np.asarray(L.born_weights(COSMO, geom, BINS))  # nearest first
    want = w @ c_steps[::-1]
    np.testing.assert_allclose(k, np.broadcast_to(want[:, None, None], k.shape), rtol=1e-5)
    assert np.all(w[0, 4:] == 0) and np.all(w[:, :4] > 0)  # bin 0 ends at z = 0.8 (chi ~ 1950)


def test_born_convergence_gradients_match_finite_differences(geom):
    grid = grid_for((2, 2))
    with jax.enable_x64(True):
        c = host_cosmo()
        planes = jnp.asarray(_random_planes(3, np.float64))
        wmap = jnp.asarray(np.random.default_rng(4).normal(size=(2, NPIX, NPIX)))

        def loss0(pl, oc):
            return jnp.sum(wmap * L.born_convergence(c.replace(Omega_c=oc), pl, geom, grid, BINS))

        vg = jax.jit(jax.value_and_grad(loss0, argnums=(0, 1)))  # one compile for all calls
        loss = lambda pl, oc: vg(pl, oc)[0]  # noqa: E731
        oc = jnp.float64(c.Omega_c)
        g_pl, g_oc = vg(planes, oc)[1]
        v = jnp.asarray(_random_planes(5, np.float64))
        fd = (loss(planes + v, oc) - loss(planes - v, oc)) / 2  # exact: kappa is linear in planes
        assert float(jnp.vdot(g_pl, v)) == pytest.approx(float(fd), rel=1e-10)
        h = 1e-5
        fd = (loss(planes, oc + h) - loss(planes, oc - h)) / (2 * h)  # O(h^2) ~ 1e-10 relative
        assert float(g_oc) == pytest.approx(float(fd), rel=1e-6)


# ------------------------------------------------------------------------------ noise / spectra


def test_load_mask(tmp_path):
    assert SV.load_mask(SurveyConfig(), NPIX) is None
    m = np.ones((NPIX, NPIX), bool)
    m[0, :4] = False
    np.save(tmp_path / "mask.npy", m)
    np.testing.assert_array_equal(SV.load_mask(SurveyConfig(mask=str(tmp_path / "mask.npy")), NPIX), m)
    with pytest.raises(ValueError, match=r"^survey.mask must be a \[npix, npix\] = \[8, 8\] array"):
        SV.load_mask(SurveyConfig(mask=str(tmp_path / "mask.npy")), 8)


def test_noise_sigma_and_layout_independent_noise():
    survey = SurveyConfig(sigma_e=0.26, bins=[NzBinConfig(n_gal=10.0), NzBinConfig(n_gal=2.5)])
    sig = SV.noise_sigma(survey, FOV, NPIX)
    a_pix = (FOV * 60 / NPIX) ** 2  # arcmin^2
    np.testing.assert_allclose(sig, [0.26 / np.sqrt(10 * a_pix), 0.26 / np.sqrt(2.5 * a_pix)], rtol=1e-12)
    key = jax.random.key(11)
    mask = np.ones((NPIX, NPIX), bool)
    mask[:3, 5:9] = False
    outs = []
    for pd in [(1, 1), (2, 4), (8, 1)]:
        grid = grid_for(pd)
        k0 = jax.device_put(np.zeros((2, NPIX, NPIX), np.float32),
                            jax.sharding.NamedSharding(grid.mesh, L.KAPPA_SPEC))
        obs = SV.add_noise(key, k0, sig, mask)
        assert obs.kappa.sharding.is_equivalent_to(k0.sharding, 3)
        outs.append(np.asarray(obs.kappa))
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    assert np.all(outs[0][:, ~mask] == 0) and np.array_equal(obs.mask, mask)
    np.testing.assert_array_equal(obs.sigma, sig)
    n = outs[0][:, mask] / sig[:, None]
    assert abs(n.std() - 1) < 5 / np.sqrt(2 * n.size)  # 5 sigma for ~500 draws


def test_map_power_spectrum_of_white_noise_is_flat():
    """White noise of variance s^2: C_ell = s^2 A_pix (sr) in every bin; each bin mean has
    relative scatter sqrt(2 / n_modes / n_maps) (pairs of modes +-n are equal), 5 sigma here."""
    npix, fov, s, n_maps = 128, 4.0, 0.02, 4
    maps = np.random.default_rng(6).normal(0.0, s, size=(n_maps, npix, npix))
    ell, cl, nm = LB.map_power_spectrum(maps, fov, n_bins_ell=12)
    a_pix = np.radians(fov / npix) ** 2
    assert cl.shape == (n_maps, 12) and ell.shape == nm.shape == (12,)
    ratio = cl.mean(0) / (s ** 2 * a_pix)
    assert np.all(np.abs(ratio - 1) < 5 * np.sqrt(2.0 / (nm * n_maps)))
    # the Tukey taper is normalised by its mean square: white noise stays at s^2 A_pix
    _, clt, _ = LB.map_power_spectrum(maps, fov, n_bins_ell=12, taper=0.5)
    assert np.all(np.abs(clt.mean(0) / (s ** 2 * a_pix) - 1) < 5 * np.sqrt(2.0 / (nm * n_maps)) * 1.5)
    lf = 2 * np.pi / np.radians(fov)
    assert np.all(np.diff(ell) > 0) and ell[0] > lf and ell[-1] < lf * npix / 2
    # a single cosine of n = 3 cycles: all power at ell = 3 * ell_f, C = A (amp/2)^2 * 2 / n_modes
    x = np.arange(npix)
    cosmap = np.broadcast_to(np.cos(2 * np.pi * 3 * x / npix)[:, None], (npix, npix))
    ell, cl, nm = LB.map_power_spectrum(cosmap, fov, ell_edges=[2.5 * lf, 3.5 * lf, 10 * lf])
    assert cl[1] == pytest.approx(0.0, abs=1e-20)
    assert cl[0] * nm[0] == pytest.approx(2 * np.radians(fov) ** 2 / 4)
