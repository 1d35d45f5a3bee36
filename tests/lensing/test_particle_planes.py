"""Lens planes painted from the particles (fli/lensing/particle_planes.py): where a particle lands and
with what weight (by hand), mass conservation, the slab cut against painting every particle,
layouts, derivatives against finite differences, and what the compiled hook exchanges."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fli.lensing import born as L
from fli.cli.compose import compose
from fli.config import ConfigError
from fli.cosmo.background import planck18
from fli.forward import build_forward, fiducial_cosmology
from fli.sim.grid import Grid
from fli.lensing.particle_planes import paint_plane, particle_plane_hook, shot_noise_cl
from fli.sim.sharding import hlo_collectives, make_mesh
from tests.helpers.physics import LAYOUTS

COSMO = planck18()
# cubic cells of 6.25 Mpc/h; 4 slabs of 200 Mpc/h (32 cells); the 5-degree map is 61 Mpc/h
# wide at the farthest plane (r = 700), inside the 100 Mpc/h box
SHAPE, BOX = (16, 16, 128), (100.0, 100.0, 800.0)
N_PLANES, FOV, NPIX, ZMAX = 4, 5.0, 8, 0.25
HALO = 2


@pytest.fixture(scope="module")
def geom():
    g = L.LensGeometry.create(COSMO, BOX, SHAPE, N_PLANES, FOV, NPIX, ZMAX)
    assert g.n_used == 4 and not g.replicated
    return g


def _unit(geom, i):
    """Value of one whole particle in one pixel of plane i: V / (pixel side r_i)^2 [Mpc/h]."""
    return np.prod(geom.cell) / (geom.pixel_size_rad * geom.plane_r[i]) ** 2


def _at(geom, i, jx, jy, z=None, dx=0.0, dy=0.0):
    """A position on plane i seen at pixel (jx + dx, jy + dy) (pixel units), depth z."""
    r = geom.plane_r[i]
    th = geom.theta
    x = BOX[0] / 2 + (th[jx] + dx * geom.pixel_size_rad) * r
    y = BOX[1] / 2 + (th[jy] + dy * geom.pixel_size_rad) * r
    return [x, y, r if z is None else z]


def test_one_particle_lands_at_its_angle_with_its_slab_fraction(geom):
    with jax.enable_x64(True):
        i, u = 2, _unit(geom, 2)

        def paint(*pos, mass=1.0):
            p = jnp.asarray(np.array(pos, np.float64))
            return np.asarray(paint_plane(p, jnp.ones(p.shape[:-1]) * mass, i, geom))

        pl = paint(_at(geom, i, 2, 5))  # at a pixel centre, mid-slab: all of it in that pixel
        want = np.zeros((NPIX, NPIX))
        want[2, 5] = u
        np.testing.assert_allclose(pl, want, rtol=1e-12, atol=1e-12 * u)
        # halfway between two pixel centres along x, a quarter along y: bilinear shares
        pl = paint(_at(geom, i, 2, 5, dx=0.5, dy=0.25))
        np.testing.assert_allclose(pl[2:4, 5:7], u * np.array([[0.375, 0.125], [0.375, 0.125]]), rtol=1e-10)
        assert pl.sum() == pytest.approx(u, rel=1e-12)
        # the slab [i dr, (i + 1) dr) = [400, 600): a particle a quarter cell (6.25) inside its lower
        # edge keeps 3/4 of its mass, one a quarter cell outside 1/4, one two cells away none
        cz = geom.cell[2]
        for z, frac in ((400 + 0.25 * cz, 0.75), (400 - 0.25 * cz, 0.25), (600 - 0.25 * cz, 0.75), (600 + 2 * cz, 0.0)):
            assert paint(_at(geom, i, 2, 5, z=z)).sum() == pytest.approx(frac * u, rel=1e-12, abs=1e-15), z
        # periodic box: a position one box away is the same particle
        p = _at(geom, i, 2, 5)
        np.testing.assert_allclose(paint([p[0] + BOX[0], p[1] - BOX[1], p[2] + BOX[2]]), paint(p), rtol=1e-12)
        # outside the field of view (the map is not periodic): nothing; mass scales linearly
        assert np.all(paint(_at(geom, i, 0, 5, dx=-1.5)) == 0)
        np.testing.assert_allclose(paint(_at(geom, i, 2, 5), mass=2.0), 2 * paint(_at(geom, i, 2, 5)), rtol=1e-12)


def test_painting_conserves_mass_inside_the_map(geom):
    """Particles anywhere inside the map's inner pixels and inside the slab deposit N V / (pixel
    area at r_i) in all: nothing lost, nothing counted twice."""
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        for i in range(geom.n_used):
            n = 500
            u = rng.uniform(0.0, NPIX - 1.0, size=(n, 2))  # pixel coordinates, all 4 corners inside
            th = (u + 0.5 - 0.5 * NPIX) * geom.pixel_size_rad
            r = geom.plane_r[i]
            z = rng.uniform(i * geom.dr + 0.5 * geom.cell[2], (i + 1) * geom.dr - 0.5 * geom.cell[2], n)
            pos = np.stack([BOX[0] / 2 + th[:, 0] * r, BOX[1] / 2 + th[:, 1] * r, z], axis=-1)
            pl = np.asarray(paint_plane(jnp.asarray(pos), jnp.ones(n), i, geom))
            assert pl.sum() == pytest.approx(n * _unit(geom, i), rel=1e-12)
            assert pl.min() >= 0


def _random_disp(seed, scale=1.9, dtype=np.float32):
    """Displacements up to `scale` cells (inside the halo of 2): far enough along z that the
    slab cut must reach 2 cells beyond each slab."""
    rng = np.random.default_rng(seed)
    cell = np.asarray(BOX) / np.asarray(SHAPE)
    d = rng.uniform(-scale, scale, size=(*SHAPE, 3)) * cell[0]
    return d.astype(dtype)


def _all_particles_reference(geom, disp, sub=1, scheme="cic"):
    """Every particle painted onto every plane (no slab cut, one device), nearest first; with
    ``sub``, as sub x sub sub-particles whose displacements are interpolated here with np.roll."""
    cell = np.asarray(BOX) / np.asarray(SHAPE)
    q = np.stack(np.meshgrid(*(np.arange(n) for n in SHAPE), indexing="ij"), axis=-1).astype(float)
    pos, mass = [], []
    for ox in [(a + 0.5) / sub - 0.5 for a in range(sub)]:
        nx_ = -1 if ox < 0 else 1  # the neighbour on the side of the offset
        dx_ = (1 - abs(ox)) * disp + abs(ox) * np.roll(disp, -nx_, axis=0)
        for oy in [(a + 0.5) / sub - 0.5 for a in range(sub)]:
            ny_ = -1 if oy < 0 else 1
            d = (1 - abs(oy)) * dx_ + abs(oy) * np.roll(dx_, -ny_, axis=1)
            pos.append(((q + [ox, oy, 0.0]) * cell + d).reshape(-1, 3))
            mass.append(np.full(pos[-1].shape[0], 1.0 / sub ** 2))
    pos = jnp.asarray(np.concatenate(pos).astype(disp.dtype))
    mass = jnp.asarray(np.concatenate(mass).astype(disp.dtype))
    return np.stack([np.asarray(paint_plane(pos, mass, i, geom, scheme)) - geom.dr for i in range(geom.n_used)])


def _sharded(disp, grid):
    return jax.device_put(disp, jax.sharding.NamedSharding(grid.mesh, jax.sharding.PartitionSpec("x", "y")))


def _run_hook(hook, disp, n):
    @jax.jit
    def run(d):  # as fli.sim.nbody calls it: hook(density, disp, a, step) in a scan over the steps
        def body(carry, j):
            return carry, hook(None, d, 1.0, j)
        return jax.lax.scan(body, 0, jnp.arange(n))[1]
    return run(disp)


def test_particle_planes_identical_on_every_layout_and_to_painting_every_particle(geom):
    disp = _random_disp(1)
    ref = _all_particles_reference(geom, disp)[::-1]  # steps order: farthest first
    assert np.ptp(ref) > geom.dr  # the planes are far from uniform: a check that can fail
    for pd in LAYOUTS:
        grid = Grid(SHAPE, BOX, make_mesh(pd), halo=HALO)
        hook = particle_plane_hook(geom, grid)
        planes, reach = _run_hook(hook, _sharded(disp, grid), geom.n_used)
        assert planes.shape == (geom.n_used, NPIX, NPIX)
        assert planes.sharding.is_equivalent_to(jax.sharding.NamedSharding(grid.mesh, L.KAPPA_SPEC), 3)
        # float32 sums in another order: relative to the largest pixel
        np.testing.assert_allclose(np.asarray(planes), ref, rtol=0, atol=2e-6 * np.abs(ref).max(), err_msg=str(pd))
        want_reach = np.abs(disp[..., 2]).max() / (BOX[0] / SHAPE[0])
        np.testing.assert_allclose(np.asarray(reach), want_reach, rtol=1e-6)
    # the halves: each a checkerboard of particles with twice the mass; together the whole
    grid = Grid(SHAPE, BOX, make_mesh((2, 2)), halo=HALO)
    three, _ = _run_hook(particle_plane_hook(geom, grid, halves=True), _sharded(disp, grid), geom.n_used)
    three = np.asarray(three)  # [n, 3, npix, npix]
    np.testing.assert_allclose(three[:, 0], ref, rtol=0, atol=2e-6 * np.abs(ref).max())
    np.testing.assert_allclose(0.5 * (three[:, 1] + three[:, 2]), ref, rtol=0, atol=4e-6 * np.abs(ref).max())
    assert np.abs(three[:, 1] - three[:, 2]).max() > 0.1 * np.abs(ref).max()


def test_tsc_planes_weights_conservation_and_slab_cut(geom):
    """simulation.assignment=tsc paints a particle as a TSC cloud: 3 x 3 pixels with the weights
    (1/8, 3/4, 1/8) per axis at a pixel centre, a z-weight that is TSC's profile's share of the
    slab (1/2 at an edge; the shares of neighbouring slabs add to 1), and the hook's slab cut,
    wider by a cell, still sees every particle that reaches a slab."""
    i = 2
    with jax.enable_x64(True):
        u = _unit(geom, i)

        def paint(pos, j=i):
            return np.asarray(paint_plane(jnp.asarray(np.array([pos], np.float64)), jnp.ones(1), j, geom, "tsc"))

        pl = paint(_at(geom, i, 3, 4))
        w = np.array([0.125, 0.75, 0.125])
        np.testing.assert_allclose(pl[2:5, 3:6], u * np.outer(w, w), rtol=1e-12)
        assert pl.sum() == pytest.approx(u, rel=1e-12)
        cz, edge = geom.cell[2], (i + 1) * geom.dr
        assert paint(_at(geom, i, 3, 4, z=edge)).sum() == pytest.approx(0.5 * u, rel=1e-12)
        for z in (edge - 1.2 * cz, edge - 0.3 * cz, edge + 0.7 * cz, edge + 1.6 * cz):
            shares = [paint(_at(geom, i, 3, 4, z=z), j).sum() / _unit(geom, j) for j in (i, i + 1)]
            assert sum(shares) == pytest.approx(1.0, rel=1e-12), z
    disp = _random_disp(1)
    ref = _all_particles_reference(geom, disp, scheme="tsc")[::-1]
    grid = Grid(SHAPE, BOX, make_mesh((2, 2)), halo=HALO, assignment="tsc")
    planes, _ = _run_hook(particle_plane_hook(geom, grid), _sharded(disp, grid), geom.n_used)
    np.testing.assert_allclose(np.asarray(planes), ref, rtol=0, atol=2e-6 * np.abs(ref).max())
    assert np.abs(ref - _all_particles_reference(geom, disp)[::-1]).max() > 1e-3 * np.abs(ref).max()


def test_tsc_plane_gradients_are_continuous_where_cic_jumps(geom):
    """A particle moved through where its weights change piece (CIC: a pixel centre, and half a
    cell inside a slab's edge; TSC: half a pixel off a centre, the same z): the gradient of a
    weighted plane jumps with CIC and not with TSC (fli/sim/assignment.py, docs/muse_studies.md)."""
    i = 1
    wts = jnp.asarray(np.random.default_rng(7).normal(size=(NPIX, NPIX)))
    jumps = {}
    with jax.enable_x64(True):
        for scheme, dx in (("cic", 0.0), ("tsc", 0.5)):
            def loss(p, scheme=scheme):
                return jnp.sum(wts * paint_plane(p[None], jnp.ones(1), i, geom, scheme))

            grad = jax.jit(jax.grad(loss))
            z = i * geom.dr + 0.5 * geom.cell[2]
            out = []
            for eps in (-1e-9, 1e-9):
                x, y, _ = _at(geom, i, 3, 4, dx=dx + eps / geom.pixel_size_rad / geom.plane_r[i], dy=0.3)
                out.append(np.asarray(grad(jnp.asarray([x, y, z + eps]))))
            jumps[scheme] = np.abs(out[1] - out[0]).max() / np.abs(out[0]).max()
    # CIC's slopes change by O(1) of the gradient; TSC's by 2e-9 times a curvature of O(1 / cell)
    assert jumps["cic"] > 0.05, jumps
    assert jumps["tsc"] < 1e-6, jumps


def test_subparticles_interpolate_the_displacements_across_devices(geom):
    """2 x 2 sub-particles per particle, their displacements interpolated from the neighbours
    (exchanged between devices): the same planes on every layout as np.roll's interpolation on
    one array; less shot noise than whole particles (their planes' pixel scatter is smaller)."""
    with jax.enable_x64(True):  # float32 positions move the CIC weights by 1e-5 of a pixel: compare in float64
        disp = _random_disp(6, dtype=np.float64)
        ref = _all_particles_reference(geom, disp, sub=2)[::-1]
        for pd in [(1, 1), (2, 4), (8, 1)]:
            grid = Grid(SHAPE, BOX, make_mesh(pd), halo=HALO)
            planes, _ = _run_hook(particle_plane_hook(geom, grid, sub=2), _sharded(disp, grid), geom.n_used)
            np.testing.assert_allclose(np.asarray(planes), ref, rtol=0, atol=1e-10 * np.abs(ref).max(),
                                       err_msg=str(pd))
        # a uniform shift moves every sub-particle with it: the sub-lattice is exactly 2x finer
        shift = np.broadcast_to(np.asarray([1.3, -0.7, 2.1]), disp.shape).copy()
        grid = Grid(SHAPE, BOX, make_mesh((2, 2)), halo=HALO)
        planes, _ = _run_hook(particle_plane_hook(geom, grid, sub=2), _sharded(shift, grid), geom.n_used)
        np.testing.assert_allclose(np.asarray(planes), _all_particles_reference(geom, shift, sub=2)[::-1],
                                   rtol=0, atol=1e-10 * np.abs(ref).max())
        whole, _ = _run_hook(particle_plane_hook(geom, grid, sub=1), _sharded(disp, grid), geom.n_used)
        planes, _ = _run_hook(particle_plane_hook(geom, grid, sub=2), _sharded(disp, grid), geom.n_used)
        assert np.asarray(planes).std() < np.asarray(whole).std()


@pytest.mark.parametrize(("sub", "scheme"), [(1, "cic"), (2, "cic"), (1, "tsc")])
def test_particle_plane_gradients_match_finite_differences(geom, sub, scheme):
    """d/d(disp) of a weighted sum of all planes, against central differences along a random
    direction: CIC and the slab weights are piecewise linear (TSC's quadratic, its slab weight
    cubic), so a step of 1e-6 cells that crosses no edge of a piece gives the derivative to float64
    rounding (TSC: plus O(1e-12) of truncation)."""
    grid = Grid(SHAPE, BOX, make_mesh((2, 2)), halo=HALO, assignment=scheme)
    hook = particle_plane_hook(geom, grid, sub=sub)
    with jax.enable_x64(True):
        disp = jnp.asarray(_random_disp(2, dtype=np.float64))
        w = jnp.asarray(np.random.default_rng(3).normal(size=(geom.n_used, NPIX, NPIX)))

        def loss(d):
            def body(carry, j):
                return carry + jnp.sum(w[j] * hook(None, d, 1.0, j)[0]), None
            return jax.lax.scan(body, jnp.float64(0.0), jnp.arange(geom.n_used))[0]

        vg = jax.jit(jax.value_and_grad(loss))
        g = vg(disp)[1]
        v = jnp.asarray(np.random.default_rng(4).normal(size=disp.shape))
        h = 1e-6 * BOX[0] / SHAPE[0]
        fd = (vg(disp + h * v)[0] - vg(disp - h * v)[0]) / (2 * h)
        assert float(jnp.vdot(g, v)) == pytest.approx(float(fd), rel=1e-6)
        assert float(jnp.abs(g).max()) > 0


def test_compiled_hook_exchanges_one_plane_not_the_field(geom):
    grid = Grid(SHAPE, BOX, make_mesh((2, 4)), halo=HALO)
    hook = particle_plane_hook(geom, grid)
    disp = _sharded(_random_disp(5), grid)
    hlo = jax.jit(lambda d: hook(None, d, 1.0, 1)).lower(disp).compile().as_text()
    sizes = [n for (_, n) in hlo_collectives(hlo).elements()]
    assert max(sizes, default=0) <= NPIX * NPIX, sizes  # at most one plane; the field is 16 x 16 x 32 x 3
    assert "reduce-scatter" in hlo or "all-reduce" in hlo


def test_poisson_shot_noise_formula(geom):
    """N_b = sum_i q_b(r_i)^2 V dr / r_i^2 by hand for one plane of unit weight."""
    w = np.zeros((1, geom.n_used))
    w[0, 1] = 2.0
    want = 4.0 * np.prod(geom.cell) * geom.dr / geom.plane_r[1] ** 2
    assert shot_noise_cl(geom, w)[0] == pytest.approx(want, rel=1e-12)


TINY_PARTICLES = ["experiment=tiny", "lensing.planes=particles"]


def test_forward_with_particle_planes_and_its_refusals():
    cfg, _ = compose(TINY_PARTICLES)
    fwd = build_forward(cfg)
    assert fwd.planes == "particles"
    c = fiducial_cosmology(cfg)
    noise = jax.random.normal(jax.random.PRNGKey(0), fwd.grid.shape)
    kappa, aux = jax.jit(lambda n: fwd(c, n))(noise)
    assert kappa.shape == fwd.kappa_shape and np.all(np.isfinite(np.asarray(kappa)))
    assert aux.max_disp.shape == (fwd.geometry.n_used,) and float(aux.max_disp.max()) < fwd.grid.halo
    # the linear forward has no particles: it cuts its planes from the linear field whatever
    # lensing.planes says, so the default config's linear forward runs as it did
    assert build_forward(compose([*TINY_PARTICLES, "simulation.forward=linear"])[0]).kind == "linear"
    with pytest.raises(ConfigError, match="field of view inside the box"):
        build_forward(compose([*TINY_PARTICLES, "lensing.fov_deg=12", "lensing.allow_replication=true"])[0])
    with pytest.raises(ConfigError, match="lensing.planes"):
        compose(["experiment=tiny", "lensing.planes=voxels"])
