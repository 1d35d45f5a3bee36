"""CIC and TSC paint/read with halos: against numpy on the global periodic box, on every layout."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # if run alone

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from fli.sim import assignment  # noqa: E402
from fli.sim import painting
from fli.sim.halo import EXCHANGES, fold_exchange, pad_exchange  # noqa: E402
from fli.sim.painting import (  # noqa: E402
    check_halo,
    max_displacement,
    required_halo,
)
from fli.sim.sharding import make_mesh  # noqa: E402

LAYOUTS = [(1, 1), (2, 2), (2, 4), (1, 8), (8, 1)]
HALO = 2
SCHEMES = painting.SCHEMES
# how far a particle may move in x and y: CIC -h <= d < h, TSC |d| < h - 1/2 (one more point)
REACH = {"cic": HALO, "tsc": HALO - 0.5}


def _shape(pdims):
    # non-cubic, nx != ny; the smallest local block is 2 cells (= HALO) on (2, 4), (1, 8), (8, 1)
    return (8, 16, 12) if pdims == (1, 8) else (16, 8, 12)


def _mesh(pdims):
    if jax.device_count() < pdims[0] * pdims[1]:
        pytest.skip(f"needs {pdims[0] * pdims[1]} devices")
    return make_mesh(pdims)


def _put(x, mesh, spec=None):
    return jax.device_put(x, NamedSharding(mesh, P("x", "y") if spec is None else spec))


def _disp(rng, shape, halo, dtype=np.float32):
    """Random displacements using the whole halo in x and y (exact limit: -h <= d < h), with
    some particles pinned at both limits; z displacements of several box lengths."""
    d = rng.uniform(-halo, halo, shape + (3,))
    d[..., 2] = rng.uniform(-30, 30, shape)
    d[0, 0, 0, :2] = -halo
    d[-1, -1, -1, :2] = halo - 1e-3
    d[1, 2, 3, 0] = halo - 1e-3
    return d.astype(dtype)


# --------------------------------------------------------------------------- numpy reference


def _kernel(x, scheme):
    """The 1D assignment kernel at distance ``x`` (cells) from a grid point, written from its
    definition (Hockney & Eastwood): CIC the tent ``1 - |x|``, TSC the quadratic spline."""
    a = np.abs(x)
    if scheme == "cic":
        return np.maximum(1.0 - a, 0.0)
    return np.where(a < 0.5, 0.75 - a**2, np.where(a < 1.5, 0.5 * (1.5 - a) ** 2, 0.0))


def _corners(disp, scheme="cic"):
    """Every grid point within two cells of each particle, with the kernel's weight there."""
    shape = disp.shape[:3]
    n = np.array(shape)
    lag = np.stack(np.meshgrid(*[np.arange(s) for s in shape], indexing="ij"), -1)
    q = lag + disp.astype(np.float64)
    i0 = np.floor(q).astype(int)
    for c in np.ndindex(4, 4, 4):
        pt = i0 + np.array(c) - 1
        idx = pt % n
        yield (idx[..., 0], idx[..., 1], idx[..., 2]), np.prod(_kernel(q - pt, scheme), -1)


def np_paint(disp, weight=None, scheme="cic"):
    out = np.zeros(disp.shape[:3])
    weight = np.ones(disp.shape[:3]) if weight is None else weight
    for idx, w in _corners(disp, scheme):
        np.add.at(out, idx, w * weight)
    return out


def np_read(field, disp, scheme="cic"):
    return sum(w * field[idx] for idx, w in _corners(disp, scheme))


# --------------------------------------------------------------------------- paint and read


# CIC on every layout and exchange; TSC, whose halo logic differs only in its reach, on a pencil
# layout with both exchanges and on a slab (each case compiles for ~1 s)
MATCH_CASES = ([(p, ex, "cic") for p in LAYOUTS for ex in EXCHANGES]
               + [((2, 4), ex, "tsc") for ex in EXCHANGES] + [((1, 8), "ppermute", "tsc")])


@pytest.mark.parametrize(("pdims", "exchange", "scheme"), MATCH_CASES)
def test_paint_and_read_match_numpy(pdims, exchange, scheme):
    mesh = _mesh(pdims)
    shape = _shape(pdims)
    rng = np.random.default_rng(1)
    disp = _disp(rng, shape, REACH[scheme])
    kw = {"exchange": exchange, "scheme": scheme}
    weight = rng.uniform(0.5, 2.0, shape).astype(np.float32)
    comps = rng.normal(size=(3,) + shape).astype(np.float32)

    variants = pdims == (2, 4)  # the other input forms once (each compile costs ~1 s here)

    @jax.jit
    def run(d, w, comps):
        out = [
            painting.paint(d, mesh, HALO, **kw),
            painting.paint(d, mesh, HALO, w, **kw),
            painting.read(comps, d, mesh, HALO, **kw),
        ]
        if variants:
            out.append(jnp.stack([painting.read(c, d, mesh, HALO, **kw) for c in comps], -1))
            out.append(painting.read(tuple(comps), d, mesh, HALO, **kw))
        return out

    out = run(_put(disp, mesh), _put(weight, mesh), _put(comps, mesh, P(None, "x", "y")))
    rho, rho_w, three = (np.asarray(r) for r in out[:3])
    assert rho.shape == shape and rho.dtype == np.float32 and three.shape == shape + (3,)

    # paint. float32: each cell sums a few dozen float32 weight products (eps 6e-8 each); 1e-5
    # of the peak leaves two orders of magnitude of margin
    for got, want in ((rho, np_paint(disp, None, scheme)), (rho_w, np_paint(disp, weight, scheme))):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    # mass conservation: float32 sum of 1536 values of order 1 (pairwise rounding ~1e-7)
    np.testing.assert_allclose(rho.astype(np.float64).sum(), np.prod(shape), rtol=1e-6)

    # read. float32: 8 (27) products of float32 weights and unit-variance values: 1e-5 absolute
    for c in range(3):
        np.testing.assert_allclose(three[..., c], np_read(comps[c].astype(np.float64), disp, scheme), atol=1e-5)
    if variants:
        singles, as_tuple = (np.asarray(r) for r in out[3:])
        # one pass of three components == three single reads: the same arithmetic per
        # component, only XLA's fusion/FMA choices may differ: 1e-6
        np.testing.assert_allclose(three, singles, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(three, as_tuple)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("pdims", [(1, 1), (2, 4)])
def test_lattice_paints_exactly_one(pdims, scheme):
    mesh = _mesh(pdims)
    shape = _shape(pdims)
    paint = jax.jit(lambda d: [painting.paint(d, mesh, HALO, exchange=ex, scheme=scheme) for ex in EXCHANGES])
    # unperturbed, and shifted by whole cells across the device boundaries (CIC weights 1 and 0;
    # TSC 1/8, 3/4, 1/8, exact in binary)
    big = 2 if scheme == "cic" else 1  # whole cells within REACH
    for shift in ((0, 0, 0), (1, -big, 5), (-big, 1, -13)):
        disp = np.broadcast_to(np.asarray(shift, np.float32), shape + (3,))
        for rho in paint(_put(np.array(disp), mesh)):
            assert np.array_equal(np.asarray(rho), np.ones(shape, np.float32)), shift


@pytest.mark.parametrize("scheme", SCHEMES)
def test_mass_conservation_float64_and_overflow(scheme):
    mesh = _mesh((2, 4))
    shape = _shape((2, 4))
    rng = np.random.default_rng(2)
    with jax.enable_x64(True):
        disp = _disp(rng, shape, REACH[scheme], np.float64)
        # particles far beyond the halo are clipped onto it: mass is still conserved, and the
        # measured displacement flags the overflow
        wild = disp * 3.0

        @jax.jit
        def run(d, wild):
            sums = [painting.paint(x, mesh, HALO, exchange=ex, scheme=scheme).sum() for x in (d, wild)
                    for ex in EXCHANGES]
            rho = painting.paint(wild, mesh, HALO, scheme=scheme)
            return jnp.stack(sums), rho.dtype == jnp.float64, rho.min(), max_displacement(wild)

        sums, is64, rho_min, m = run(_put(disp, mesh), _put(wild, mesh))
    assert bool(is64) and float(rho_min) >= 0.0
    # float64: 1536 unit masses, rounding ~1e-13
    np.testing.assert_allclose(np.asarray(sums), np.prod(shape), rtol=0, atol=1e-9)
    assert float(m) == pytest.approx(np.abs(wild[..., :2]).max())
    with pytest.raises(ValueError, match="increase simulation.halo"):
        check_halo(m, HALO, scheme=scheme)


# --------------------------------------------------------------------------- adjoints, gradients


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("pdims", [(2, 4), (1, 8)])
def test_paint_and_read_are_transposes(pdims, scheme):
    mesh = _mesh(pdims)
    shape = _shape(pdims)
    rng = np.random.default_rng(4)
    nx, ny, nz = shape
    with jax.enable_x64(True):
        disp = _put(_disp(rng, shape, REACH[scheme], np.float64), mesh)
        w = _put(rng.normal(size=shape), mesh)
        f = _put(rng.normal(size=shape), mesh)
        padded = _put(rng.normal(size=(nx + 2 * HALO * pdims[0], ny + 2 * HALO * pdims[1], nz)), mesh)

        @jax.jit
        def products(disp, w, f, padded):
            out = []
            for ex in EXCHANGES:
                out.append(jnp.vdot(painting.paint(disp, mesh, HALO, w, exchange=ex, scheme=scheme), f))
                out.append(jnp.vdot(w, painting.read(f, disp, mesh, HALO, exchange=ex, scheme=scheme)))
                out.append(jnp.vdot(pad_exchange(f, mesh, HALO, ex), padded))
                out.append(jnp.vdot(f, fold_exchange(padded, mesh, HALO, ex)))
            return jnp.stack(out)

        p = np.asarray(products(disp, w, f, padded)).reshape(len(EXCHANGES), 2, 2)
    # float64, sums of ~1e3 terms of order 1: 1e-12 relative. <paint(d, w), f> == <w, read(f, d)>,
    # and the halo exchanges alone: fold is the transpose of pad; both exchanges agree
    np.testing.assert_allclose(p[..., 0], p[..., 1], rtol=1e-12)
    np.testing.assert_allclose(p[0], p[-1], rtol=1e-12)


def _directional_fd(loss, x, v, eps=1e-6):
    return (loss(x + eps * v) - loss(x - eps * v)) / (2 * eps)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("exchange", EXCHANGES)
@pytest.mark.parametrize("pdims", [(2, 4)])
def test_gradients_match_finite_differences(pdims, exchange, scheme):
    mesh = _mesh(pdims)
    shape = _shape(pdims)
    rng = np.random.default_rng(5)
    with jax.enable_x64(True):
        # keep 1e-6 away from where the kernel's pieces meet (CIC: integer offsets, TSC:
        # half-integer ones) so that +-eps stays on one polynomial piece
        d0 = _disp(rng, shape, REACH[scheme] - 0.01, np.float64)
        off = 0.0 if scheme == "cic" else 0.5
        frac = d0 + off - np.floor(d0 + off)
        d0 = np.where(frac < 1e-3, d0 + 2e-3, np.where(frac > 1 - 1e-3, d0 - 2e-3, d0))
        kw = {"exchange": exchange, "scheme": scheme}
        d = _put(d0, mesh)
        w = _put(rng.uniform(0.5, 2.0, shape), mesh)
        f = _put(rng.normal(size=shape), mesh)
        f3 = _put(rng.normal(size=(3,) + shape), mesh, P(None, "x", "y"))
        ct = _put(rng.normal(size=shape + (3,)), mesh)

        @jax.jit
        def paint_loss(d, w):
            return jnp.vdot(painting.paint(d, mesh, HALO, w, **kw), f)

        @jax.jit
        def read_loss(d, g):
            return jnp.vdot(painting.read(g, d, mesh, HALO, **kw), ct)

        @jax.jit
        def grads(d, w, g):
            return jax.grad(paint_loss, (0, 1))(d, w), jax.grad(read_loss, (0, 1))(d, g)

        (gd_p, gw), (gd_r, gf) = grads(d, w, f3)
        vd = _put(rng.normal(size=d.shape), mesh)
        vw = _put(rng.normal(size=shape), mesh)
        vf = _put(rng.normal(size=f3.shape), mesh, P(None, "x", "y"))
        r = []
        for loss, o, g_d, g_o, v in ((paint_loss, w, gd_p, gw, vw), (read_loss, f3, gd_r, gf, vf)):
            r.append((jnp.vdot(g_d, vd), _directional_fd(lambda x: loss(x, o), d, vd)))
            r.append((jnp.vdot(g_o, v), _directional_fd(lambda x: loss(d, x), o, v)))
        r = np.asarray(r, dtype=np.float64)
    # float64: CIC is multilinear and TSC quadratic per axis on each piece, so central differences
    # are exact up to rounding (~1e-16 / 1e-6 relative to sums of order 1e2): 1e-7 relative
    np.testing.assert_allclose(r[:, 0], r[:, 1], rtol=1e-7)


def test_gradients_agree_between_exchanges_float32():
    # a slab layout (the finite-difference test covers the pencil one)
    mesh = _mesh((1, 8))
    shape = _shape((1, 8))
    rng = np.random.default_rng(6)
    d = _put(_disp(rng, shape, HALO), mesh)
    f3 = _put(rng.normal(size=(3,) + shape).astype(np.float32), mesh, P(None, "x", "y"))

    def loss(d, exchange):
        rho = painting.paint(d, mesh, HALO, exchange=exchange)
        force = painting.read(f3, d, mesh, HALO, exchange=exchange)
        return jnp.sum(rho**2) + jnp.sum(force * d)

    g = [np.asarray(jax.jit(jax.grad(loss), static_argnums=1)(d, ex)) for ex in EXCHANGES]
    # float32, same arithmetic in a different order: 1e-5 of the largest component
    np.testing.assert_allclose(g[0], g[1], rtol=0, atol=1e-5 * np.abs(g[0]).max())


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("exchange", EXCHANGES)
def test_shared_stencil_gives_the_same_fields_and_gradients(exchange, scheme):
    """make_stencil computed once and passed to the paint and the read (as the PM force does)
    changes neither the values nor the gradients, the chunked read adjoint included."""
    mesh = _mesh((2, 2))
    shape = (16, 8, 12)
    rng = np.random.default_rng(7)
    d = _put(_disp(rng, shape, REACH[scheme]), mesh)
    f3 = _put(rng.normal(size=(3,) + shape).astype(np.float32), mesh, P(None, "x", "y"))

    def loss(d, shared):
        st = painting.make_stencil(d, mesh, HALO, scheme) if shared else None
        rho = painting.paint(d, mesh, HALO, exchange=exchange, stencil=st, scheme=scheme)
        force = painting.read(f3 * rho, d, mesh, HALO, exchange=exchange, stencil=st, scheme=scheme)
        return jnp.sum(rho**2) + jnp.sum(force * d), force

    (v0, f0), g0 = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)(d, False)
    (v1, f1), g1 = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)(d, True)
    # the same arithmetic, but XLA may fuse (and contract into FMAs) the weights' products
    # differently when the stencil is computed inside the read: float32 rounding, a few ulps
    np.testing.assert_allclose(np.asarray(f1), np.asarray(f0), rtol=0, atol=1e-6 * np.abs(np.asarray(f0)).max())
    np.testing.assert_allclose(float(v1), float(v0), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(g1), np.asarray(g0), rtol=0, atol=1e-5 * np.abs(np.asarray(g0)).max())


@pytest.mark.parametrize("scheme", SCHEMES)
def test_read_adjoint_slabs_match_one_slab(monkeypatch, scheme):
    """The read's adjoint loops over slabs of particles: with slabs of one row it must give
    what one slab gives."""
    mesh = _mesh((1, 2))
    shape = (16, 8, 12)
    rng = np.random.default_rng(8)
    d = _put(_disp(rng, shape, REACH[scheme]), mesh)
    f3 = _put(rng.normal(size=(3,) + shape).astype(np.float32), mesh, P(None, "x", "y"))

    def grads():
        jax.clear_caches()
        loss = lambda f, d: jnp.sum(painting.read(f, d, mesh, HALO, scheme=scheme) ** 2)  # noqa: E731
        return jax.jit(jax.grad(loss, argnums=(0, 1)))(f3, d)

    monkeypatch.setattr(assignment, "CHUNK_PARTICLES", 10**9)
    one = grads()
    monkeypatch.setattr(assignment, "CHUNK_PARTICLES", 1)  # one row per slab
    many = grads()
    for a, b in zip(one, many, strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=1e-6 * np.abs(np.asarray(a)).max())


def test_tsc_gradient_is_continuous_where_cic_jumps():
    """What TSC is for (fli/sim/assignment.py): the derivative of a painted or read quantity in a
    particle's position is continuous where the particle crosses into another stencil (CIC: a
    grid point; TSC: half-way between points), where CIC's jumps. One particle of a lattice is
    moved along x through that crossing, and the gradient is taken just before and just after."""
    mesh = _mesh((1, 1))
    shape = (8, 8, 8)
    rng = np.random.default_rng(9)
    with jax.enable_x64(True):
        f = jnp.asarray(rng.normal(size=shape))
        f3 = jnp.asarray(rng.normal(size=(3,) + shape))
        jumps = {}
        for scheme, edge in (("cic", 0.0), ("tsc", 0.5)):
            def loss(d, scheme=scheme):
                rho = painting.paint(d, mesh, HALO, scheme=scheme)
                return jnp.vdot(rho, f) + jnp.sum(painting.read(f3, d, mesh, HALO, scheme=scheme) ** 2)

            grad = jax.jit(jax.grad(loss))
            out = []
            for side in (-1e-9, 1e-9):
                d = np.zeros(shape + (3,))
                d[3, 4, 5] = (edge + side, 0.2, -0.3)
                out.append(np.asarray(grad(jnp.asarray(d)))[3, 4, 5, 0])
            jumps[scheme] = abs(out[1] - out[0])
    # the jump is sum_k f_k times the jump of the kernel's slope: O(1) for CIC with random f
    # (slopes -1/+1 swap to another pair of points); for TSC the slope is continuous, so only
    # 2e-9 times a curvature of O(10) remains, plus float64 rounding
    assert jumps["cic"] > 0.1, jumps
    assert jumps["tsc"] < 1e-6, jumps


def test_a_stencil_of_another_scheme_is_refused():
    mesh = _mesh((1, 1))
    d = jnp.zeros((8, 8, 8, 3))
    st = painting.make_stencil(d, mesh, HALO, "cic")
    assert st.scheme == "cic" and painting.make_stencil(d, mesh, HALO, "tsc").scheme == "tsc"
    with pytest.raises(ValueError, match="stencil given is cic's but scheme is 'tsc'"):
        painting.paint(d, mesh, HALO, stencil=st, scheme="tsc")
    with pytest.raises(ValueError, match="must be one of"):
        painting.read(jnp.zeros((8, 8, 8)), d, mesh, HALO, scheme="pcs")


# --------------------------------------------------------------------------- halo checks


def test_halo_validation_before_compile(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("validation must happen before tracing")

    monkeypatch.setattr(painting, "_paint", boom)
    monkeypatch.setattr(painting, "_read", boom)
    mesh = _mesh((2, 4))
    disp = jnp.zeros((16, 8, 12, 3))  # local blocks 8 x 2
    for halo in (3, 0, -1, 1.5, True):
        with pytest.raises(ValueError, match="halo") as err:
            painting.paint(disp, mesh, halo)
        if halo == 3:
            assert "(8, 2)" in str(err.value)
        with pytest.raises(ValueError, match="halo"):
            painting.read(jnp.zeros((16, 8, 12)), disp, mesh, halo)
    with pytest.raises(ValueError, match="exchange"):
        painting.paint(disp, mesh, 1, exchange="mpi")
    with pytest.raises(ValueError, match="divisible"):
        painting.paint(jnp.zeros((15, 8, 12, 3)), mesh, 1)
    with pytest.raises(ValueError, match="does not match"):
        painting.read(jnp.zeros((16, 8, 4)), disp, mesh, 1)
    with pytest.raises(ValueError, match="weight"):
        painting.paint(disp, mesh, 1, jnp.zeros((16, 8, 11)))


def test_check_halo_policies():
    assert check_halo(1.999, 2) is True
    assert check_halo(jnp.float32(0.0), 1) is True
    with pytest.raises(ValueError, match=r"particles moved 2\.5 cells but halo is 2 cells: increase "
                       r"simulation\.halo to >= 3"):
        check_halo(2.5, 2, "raise")
    with pytest.raises(ValueError, match="halo to >= 3"):
        check_halo(2.0, 2)  # d = +h would need the cell h+1 beyond the block
    with pytest.warns(RuntimeWarning, match="increase simulation.halo to >= 5"):
        assert check_halo(np.float64(4.2), 3, "warn") is False
    with pytest.raises(ValueError, match="not finite"):
        check_halo(float("nan"), 4)
    with pytest.raises(ValueError, match="policy"):
        check_halo(0.5, 2, "ignore")
    assert required_halo(0.0) == 1 and required_halo(2.5) == 3 and required_halo(3.0) == 4
    # TSC reaches one point past the nearest: |d| < h - 1/2
    assert check_halo(1.49, 2, scheme="tsc") is True
    with pytest.raises(ValueError, match=r"halo to >= 3 \(tsc footprints"):
        check_halo(1.5, 2, scheme="tsc")
    assert required_halo(0.0, "tsc") == 1 and required_halo(0.5, "tsc") == 2 and required_halo(2.4, "tsc") == 3


def test_max_displacement_ignores_z():
    mesh = _mesh((2, 2))
    disp = np.zeros((8, 8, 4, 3), np.float32)
    disp[3, 5, 1] = (-1.25, 0.5, 40.0)
    disp[6, 1, 2] = (0.25, 0.75, -9.0)
    assert float(jax.jit(max_displacement)(_put(disp, mesh))) == 1.25
