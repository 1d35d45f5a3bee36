"""Distributed FFTs (pencil and jaxdecomp backends), the k-space layout and the kernels.

Tolerances: a float32 FFT of n points has a round-off error of a few eps32 * log2(n) relative to
the largest value (eps32 = 1.2e-7), so 1e-5 relative to max|value| (about 100 eps) leaves room
for the three passes and the summation order of different layouts; float64 likewise 1e-12.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from fli.sim.fft import (
    FFTPlan,
    cic_compensation,
    gradient_kernel,
    inv_laplace_kernel,
    kgrid_norm,
    make_fft,
)
from fli.sim.sharding import FIELD_SPEC, make_mesh
from tests.helpers.processes import ROOT

LAYOUTS = [(1, 1), (2, 2), (2, 4), (1, 8), (8, 1)]
SHAPES = [(16, 8, 12), (8, 16, 9)]  # non-cubic; even and odd nz
BOX = (120.0, 60.0, 90.0)  # differs per axis, Mpc/h
TOL32 = 1e-5
TOL64 = 1e-12


def _mesh(pdims):
    if jax.device_count() < pdims[0] * pdims[1]:
        pytest.skip(f"needs {pdims[0] * pdims[1]} devices (XLA_FLAGS host device count)")
    return make_mesh(pdims)


def _field(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


def _np_kgrid(shape, box, half=True):
    """numpy |k| of numpy.fft.rfftn (half) or fftn layout, and the three components."""
    ks = [2 * np.pi * np.fft.fftfreq(n, L / n) for n, L in zip(shape, box, strict=False)]
    if half:
        ks[2] = 2 * np.pi * np.fft.rfftfreq(shape[2], box[2] / shape[2])
    kx, ky, kz = np.meshgrid(*ks, indexing="ij")
    return np.sqrt(kx**2 + ky**2 + kz**2), (kx, ky, kz)


# --------------------------------------------------------------------------- transforms


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("pdims", LAYOUTS)
def test_pencil_matches_numpy_float32(pdims, shape):
    plan = make_fft(_mesh(pdims), shape)
    x = _field(shape)
    xs = jax.device_put(x, plan.sharding)
    xk = plan.rfft(xs)
    assert xk.shape == plan.kshape and xk.dtype == jnp.complex64
    assert xk.sharding.is_equivalent_to(plan.ksharding, 3)
    ref = np.fft.rfftn(x.astype(np.float64))
    got = np.asarray(xk)
    assert _rel(got[:, :, : plan.nkz], ref) < TOL32
    assert np.all(got[:, :, plan.nkz :] == 0)  # padding stays zero
    back = plan.irfft(xk)
    assert back.dtype == jnp.float32 and back.shape == shape
    assert back.sharding.is_equivalent_to(plan.sharding, 3)
    assert _rel(back, x) < TOL32
    # the inverse alone against numpy.fft.irfftn, on a spectrum that is not from rfft
    yk = np.zeros(plan.kshape, np.complex64)
    yk[:, :, : plan.nkz] = np.fft.rfftn(_field(shape, 1)) * (1 + 0.5j)
    ref_inv = np.fft.irfftn(yk[:, :, : plan.nkz].astype(np.complex128), s=shape, axes=(0, 1, 2))
    assert _rel(plan.irfft(jax.device_put(yk, plan.ksharding)), ref_inv) < TOL32


@pytest.mark.parametrize(
    "pdims,shape", [((1, 1), (8, 8, 5)), ((2, 4), (16, 8, 12)), ((2, 4), (8, 16, 9)), ((8, 1), (8, 16, 9))]
)
def test_pencil_matches_numpy_float64(pdims, shape):
    with jax.enable_x64(True):
        plan = make_fft(_mesh(pdims), shape)
        x = _field(shape, dtype=np.float64)
        xk = plan.rfft(jax.device_put(x, plan.sharding))
        assert xk.dtype == jnp.complex128
        assert _rel(np.asarray(xk)[:, :, : plan.nkz], np.fft.rfftn(x)) < TOL64
        back = plan.irfft(xk)
        assert back.dtype == jnp.float64
        assert _rel(back, x) < TOL64


def test_plan_is_static_and_hashable():
    mesh = _mesh((2, 4))
    a, b = make_fft(mesh, (16, 8, 12)), make_fft(mesh, [16, 8, 12], "pencil")
    assert a == b and hash(a) == hash(b) and jax.tree_util.tree_leaves(a) == []
    assert a.kshape == (16, 8, 8) and a.local_kshape == (16, 4, 2) and a.nkz == 7

    @jax.jit
    def f(plan: FFTPlan, x):  # the plan passes through jit as a (leafless) pytree
        return plan.irfft(plan.rfft(x) * 2.0)

    x = jax.device_put(_field(a.shape), a.sharding)
    assert _rel(f(a, x), 2 * np.asarray(x)) < TOL32


def test_divisibility_errors():
    mesh = _mesh((2, 4))
    with pytest.raises(ValueError, match=r"\(16, 6, 8\).*pdims \(2, 4\).*ny % py"):
        make_fft(mesh, (16, 6, 8))
    with pytest.raises(ValueError, match=r"nx % px"):
        make_fft(mesh, (9, 8, 8))
    with pytest.raises(ValueError, match=r"ny % px"):
        make_fft(_mesh((4, 2)), (8, 2, 8))
    with pytest.raises(ValueError, match=r"nz % py"):
        make_fft(mesh, (16, 8, 9), backend="jaxdecomp")
    with pytest.raises(ValueError, match=r"nz % px"):
        make_fft(_mesh((8, 1)), (8, 8, 12), backend="jaxdecomp")
    with pytest.raises(ValueError, match="backend"):
        make_fft(mesh, (16, 8, 8), backend="fftw")
    plan = make_fft(mesh, (16, 8, 9))  # odd nz is fine for the pencil FFT
    with pytest.raises(ValueError, match="shape"):
        plan.rfft(jnp.zeros((16, 8, 8)))


# --------------------------------------------------------------------------- layout


@pytest.mark.parametrize("nz", [12, 9])
def test_hermitian_weight_and_valid(nz):
    plan = make_fft(_mesh((2, 4)), (8, 8, nz))
    w = np.broadcast_to(np.asarray(plan.hermitian_weight()), plan.kshape)
    v = np.broadcast_to(np.asarray(plan.valid()), plan.kshape)
    assert w.sum() == 8 * 8 * nz  # every mode of the full FFT counted once
    assert np.all(v[:, :, : plan.nkz] == 1) and np.all(v[:, :, plan.nkz :] == 0)
    assert np.all(w[:, :, plan.nkz :] == 0) and np.all(w[:, :, 0] == 1)
    # Parseval with the weights: sum_k w |x_k|^2 = N sum_r x^2
    x = _field(plan.shape, 3)
    xk = np.asarray(plan.rfft(jax.device_put(x, plan.sharding)))
    np.testing.assert_allclose((w * np.abs(xk) ** 2).sum(), x.size * (x**2).sum(), rtol=1e-5)


@pytest.mark.parametrize(
    "backend,pdims,shape",
    [("pencil", (2, 4), (16, 8, 12)), ("pencil", (8, 1), (8, 16, 9)), ("jaxdecomp", (2, 4), (16, 8, 12)),
     ("jaxdecomp", (8, 1), (8, 16, 8)), ("jaxdecomp", (1, 8), (8, 8, 16))],
)
def test_kvec_layout_and_local_blocks(backend, pdims, shape):
    plan = make_fft(_mesh(pdims), shape, backend)
    kn = np.broadcast_to(np.asarray(kgrid_norm(plan, BOX)), plan.kshape)
    kx = np.broadcast_to(np.asarray(plan.kvec(BOX)[0]), plan.kshape)
    ref, (rx, _, _) = _np_kgrid(shape, BOX, half=plan.half)
    if plan.half:
        kn, kx = kn[:, :, : plan.nkz], kx[:, :, : plan.nkz]
    else:  # jaxdecomp stores (ky, kz, kx): back to (kx, ky, kz)
        kn, kx = np.transpose(kn, (2, 0, 1)), np.transpose(kx, (2, 0, 1))
    np.testing.assert_allclose(kn, ref, rtol=1e-6)
    np.testing.assert_allclose(kx, rx, rtol=1e-6)

    # local=True inside shard_map gives this device's block of the global arrays
    def local(_):
        k = kgrid_norm(plan, BOX, local=True)
        w = plan.hermitian_weight(local=True)
        return jnp.broadcast_to(k * 10 + w, plan.local_kshape)

    f = jax.jit(jax.shard_map(local, mesh=plan.mesh, in_specs=P(), out_specs=plan.kspec, check_vma=False))
    glob = np.asarray(kgrid_norm(plan, BOX)) * 10 + np.asarray(plan.hermitian_weight())
    np.testing.assert_allclose(np.asarray(f(jnp.zeros(()))), np.broadcast_to(glob, plan.kshape), rtol=1e-6)


@pytest.mark.parametrize("pdims,shape", [((2, 4), (16, 8, 12)), ((1, 1), (6, 10, 14)), ((8, 1), (8, 16, 8))])
def test_jaxdecomp_backend_agrees_with_pencil(pdims, shape):
    mesh = _mesh(pdims)
    pen, jd = make_fft(mesh, shape), make_fft(mesh, shape, "jaxdecomp")
    assert jd.kshape == (shape[1], shape[2], shape[0])
    x = jax.device_put(_field(shape, 5), pen.sharding)
    a, b = pen.rfft(x), jd.rfft(x)
    assert b.shape == jd.kshape and b.sharding.is_equivalent_to(jd.ksharding, 3)
    full = np.transpose(np.asarray(b), (2, 0, 1))  # (ky, kz, kx) -> (kx, ky, kz)
    assert _rel(full[:, :, : pen.nkz], np.asarray(a)[:, :, : pen.nkz]) < TOL32
    # same |k| on the same modes, and the same weighted sums (power-spectrum ingredients)
    kn_p = np.broadcast_to(np.asarray(kgrid_norm(pen, BOX)), pen.kshape)[:, :, : pen.nkz]
    kn_j = np.transpose(np.broadcast_to(np.asarray(kgrid_norm(jd, BOX)), jd.kshape), (2, 0, 1))
    np.testing.assert_allclose(kn_j[:, :, : pen.nkz], kn_p, rtol=1e-6)
    sp = float(np.sum(np.asarray(pen.hermitian_weight()) * np.abs(np.asarray(a)) ** 2))
    sj = float(np.sum(np.asarray(jd.hermitian_weight()) * np.abs(np.asarray(b)) ** 2))
    assert abs(sp / sj - 1) < 1e-5
    back = jd.irfft(b)
    assert back.dtype == jnp.float32 and _rel(back, np.asarray(x)) < TOL32


# --------------------------------------------------------------------------- kernels


def _grid(shape, box):
    return np.meshgrid(*[np.arange(n) * L / n for n, L in zip(shape, box, strict=False)], indexing="ij")


@pytest.mark.parametrize("order", [0, 2, 4])
def test_gradient_of_plane_wave(order):
    shape = (16, 8, 12)
    plan = make_fft(_mesh((2, 4)), shape)
    X = _grid(shape, BOX)
    m = (3, -2, 4)  # mode numbers along x, y, z
    k = [2 * np.pi * mi / L for mi, L in zip(m, BOX, strict=False)]
    phase = sum(ki * Xi for ki, Xi in zip(k, X, strict=False))
    f = jax.device_put(np.sin(phase).astype(np.float32), plan.sharding)
    fk = plan.rfft(f)
    for axis in range(3):
        h = BOX[axis] / shape[axis]
        ka = k[axis]
        eff = {0: ka, 2: np.sin(ka * h) / h, 4: (8 * np.sin(ka * h) - np.sin(2 * ka * h)) / (6 * h)}[order]
        got = plan.irfft(fk * gradient_kernel(plan, BOX, axis, order=order))
        np.testing.assert_allclose(np.asarray(got), eff * np.cos(phase), atol=TOL32 * abs(ka) * 10)
    # the Nyquist mode of an even axis is dropped (real output, antisymmetric operator)
    gk = np.asarray(gradient_kernel(plan, BOX, 0))
    assert gk[shape[0] // 2, 0, 0] == 0 and gk[0, 0, 0] == 0


def test_inverse_laplacian_vs_numpy_and_known_field():
    shape = (16, 8, 12)
    plan = make_fft(_mesh((2, 4)), shape)
    f = _field(shape, 7)
    fk = np.fft.rfftn(f)
    k, _ = _np_kgrid(shape, BOX)
    with np.errstate(divide="ignore", invalid="ignore"):
        ref = np.fft.irfftn(np.where(k > 0, -fk / k**2, 0.0), s=shape, axes=(0, 1, 2))
    kern = inv_laplace_kernel(plan, BOX)
    got = plan.irfft(plan.rfft(jax.device_put(f, plan.sharding)) * kern)
    assert _rel(got, ref) < TOL32
    assert float(np.asarray(kern)[0, 0, 0]) == 0.0 and np.all(np.isfinite(np.asarray(kern)))
    # lap phi = cos(k.x)  =>  phi = -cos(k.x) / k^2
    X = _grid(shape, BOX)
    kv = [2 * np.pi * mi / L for mi, L in zip((1, 2, 3), BOX, strict=False)]
    phase = sum(ki * Xi for ki, Xi in zip(kv, X, strict=False))
    k2 = sum(ki**2 for ki in kv)
    g = jax.device_put(np.cos(phase).astype(np.float32), plan.sharding)
    phi = plan.irfft(plan.rfft(g) * kern)
    np.testing.assert_allclose(np.asarray(phi), -np.cos(phase) / k2, atol=TOL32 / k2)


def test_cic_compensation_and_knorm():
    shape = (8, 16, 9)
    plan = make_fft(_mesh((2, 2)), shape)
    c = np.broadcast_to(np.asarray(cic_compensation(plan)), plan.kshape)[:, :, : plan.nkz]
    ms = [np.fft.fftfreq(8), np.fft.fftfreq(16), np.fft.rfftfreq(9)]
    mx, my, mz = np.meshgrid(*ms, indexing="ij")
    ref = 1 / (np.sinc(mx) * np.sinc(my) * np.sinc(mz)) ** 2
    np.testing.assert_allclose(c, ref, rtol=1e-6)
    assert c[0, 0, 0] == 1.0
    kn = np.asarray(kgrid_norm(plan, 50.0))
    assert kn[0, 0, 0] == 0.0
    # NaN-free gradients through the k = 0 guards
    g = jax.grad(lambda s: jnp.sum(kgrid_norm(plan, 50.0) * s + inv_laplace_kernel(plan, 50.0) * s))(1.0)
    assert np.isfinite(float(g))


# --------------------------------------------------------------------------- gradients


def test_gradients_match_unsharded_jnp_fft():
    shape = (16, 8, 12)
    plan = make_fft(_mesh((2, 4)), shape)
    rng = np.random.default_rng(11)
    x = rng.standard_normal(shape).astype(np.float32)
    wv = np.zeros(plan.kshape, np.float32)
    wv[:, :, : plan.nkz] = rng.uniform(0.5, 2.0, (shape[0], shape[1], plan.nkz))
    y = rng.standard_normal(shape).astype(np.float32)

    def loss_sharded(x):
        xk = plan.rfft(x)
        return jnp.sum(jnp.abs(xk) ** 2 * wv) + jnp.sum(plan.irfft(xk * wv) * y)

    def loss_ref(x):
        xk = jnp.fft.rfftn(x)
        w = wv[:, :, : plan.nkz]
        return jnp.sum(jnp.abs(xk) ** 2 * w) + jnp.sum(jnp.fft.irfftn(xk * w, s=shape) * y)

    g = jax.jit(jax.grad(loss_sharded))(jax.device_put(x, plan.sharding))
    with jax.default_device(jax.devices()[0]):
        gref = jax.grad(loss_ref)(jnp.asarray(x))
    assert g.sharding.is_equivalent_to(plan.sharding, 3)
    assert _rel(g, gref) < 1e-5


# --------------------------------------------------------------------------- NUTS


@pytest.mark.slow(seconds=15)  # tests/infer/sample/test_nuts.py samples the sharded posterior in the default set
def test_nuts_with_sharded_latent_and_pencil_fft():
    """The crash trap: XLA's CPU FFT inside NumPyro NUTS over a sharded model (DESIGN.md)."""
    numpyro = pytest.importorskip("numpyro")
    import numpyro.distributions as dist  # noqa: PLC0415
    from numpyro.infer import MCMC, NUTS  # noqa: PLC0415

    shape, box = (16, 16, 16), 100.0
    mesh = _mesh((2, 4))
    plan = make_fft(mesh, shape)
    bx, by = shape[0] // 2, shape[1] // 4

    def to_field(s):  # replicated latent -> each device slices its own block
        def local(s):
            i, j = lax.axis_index("x") * bx, lax.axis_index("y") * by
            return lax.dynamic_slice(s, (i, j, 0), (bx, by, shape[2]))

        return jax.shard_map(local, mesh=mesh, in_specs=P(), out_specs=FIELD_SPEC, check_vma=False)(s)

    def forward(s):
        f = to_field(s)
        k = kgrid_norm(plan, box)
        smooth = jnp.exp(-0.5 * (5.0 * k) ** 2)
        # d + 0.1 dd/dx with d the smoothed field: one rfft, kernels, one irfft
        return plan.irfft(plan.rfft(f) * smooth * (1.0 + 0.1 * gradient_kernel(plan, box, 0)))

    def model(data):
        s = numpyro.sample("s", dist.Normal(0, 1).expand(shape).to_event(3))
        numpyro.sample("obs", dist.Normal(forward(s), 0.5).to_event(3), obs=data)

    truth = jax.random.normal(jax.random.key(1), shape)
    noise = 0.5 * jax.random.normal(jax.random.key(2), shape)
    data = jax.device_put(forward(truth) + noise, plan.sharding)
    mcmc = MCMC(
        NUTS(model, max_tree_depth=3), num_warmup=5, num_samples=5,
        jit_model_args=True, progress_bar=False,
    )
    mcmc.run(jax.random.key(0), data)
    s = mcmc.get_samples()["s"]
    assert s.shape == (5, *shape) and np.all(np.isfinite(np.asarray(s)))


_JD_X64_SCRIPT = """
import jax, numpy as np
from fli.sim.fft import make_fft
from fli.sim.sharding import make_mesh
plan = make_fft(make_mesh((2, 4)), (16, 8, 12), "jaxdecomp")
x = np.random.default_rng(0).standard_normal(plan.shape)
k = plan.rfft(jax.device_put(x, plan.sharding))
assert k.dtype == np.complex128, k.dtype
ref = np.fft.fftn(x)
assert np.abs(np.transpose(np.asarray(k), (2, 0, 1)) - ref).max() < 1e-12 * np.abs(ref).max()
back = plan.irfft(k)
assert back.dtype == np.float64 and np.abs(np.asarray(back) - x).max() < 1e-12
print("ok")
"""


def test_jaxdecomp_float64_with_global_x64():
    """jaxdecomp in float64 needs x64 switched on globally: under the thread-local
    ``jax.enable_x64(True)`` context its custom partitioner traces in float32 and fails
    ("Mismatch in result shapes complex64 vs complex128"). So this runs in a subprocess."""
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    pytest.importorskip("jaxdecomp")
    env = dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    root = str(ROOT)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", _JD_X64_SCRIPT], env=env, cwd=root, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
