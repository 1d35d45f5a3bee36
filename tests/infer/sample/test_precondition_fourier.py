"""The Fourier-diagonal preconditioner (fli/infer/sample/precondition_fourier.py), against dense
linear algebra and NumPy's FFT.

* On the SMALL posterior with the linear forward (8x8x32 cells; J is 128 x 2050, dense by
  ``jax.jacrev``): the probed table against the exact bin averages of J^T J's diagonal in the
  Fourier basis, computed from J's rows with ``numpy.fft.rfftn``.
* The filter: ``to_y`` inverts ``to_z``, and ``C^{1/2}`` is symmetric (a real, even factor).
* :func:`bin_sums` on a field filtered by a known table returns that table exactly.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest


@pytest.fixture(scope="module")
def linear():
    from tests.helpers.posterior import small_posterior

    post, data, truth = small_posterior(extra=["simulation.forward=linear"])
    return post, data, post.layout.pack(truth.theta, truth.s)


def _exact_table(post, data, z):
    """The bin averages of ``diag(F J^T J F^H)`` (unitary F) over the field's modes, with each
    stored mode counted as the modes of the full FFT it stands for."""
    from fli.infer.fit.lowrank import residual_flat
    from fli.infer.sample.precondition_fourier import table_shape

    lay, (nx, ny, nz) = post.layout, post.fwd.grid.shape
    jac = jax.jit(jax.jacrev(lambda x: residual_flat(post)(x, data).reshape(-1)))(z)
    rows = np.asarray(jax.jit(jax.vmap(lambda r: lay.unpack(r)[1]))(jac), np.float64)
    diag = (np.abs(np.fft.rfftn(rows, axes=(1, 2, 3))) ** 2).sum(0) / (nx * ny * nz)
    mx, my, mz = np.fft.fftfreq(nx) * nx, np.fft.fftfreq(ny) * ny, np.arange(nz // 2 + 1)
    perp = np.rint(np.hypot(mx[:, None, None], my[None, :, None])) + 0 * mz
    par = 0 * perp + mz
    w = np.where((mz == 0) | (mz == nz // 2), 1.0, 2.0) + 0 * perp
    num, count = np.zeros(table_shape(post)), np.zeros(table_shape(post))
    np.add.at(num, (perp.astype(int), par.astype(int)), w * diag)
    np.add.at(count, (perp.astype(int), par.astype(int)), w)
    return num / count, count


@pytest.mark.slow(seconds=40)  # 25-35 s here: the dense Jacobian (7 s) and 64 probes, compiled
def test_probed_table_against_the_dense_diagonal(linear):
    from fli.infer.sample.precondition_fourier import build_fourier, to_y, to_z

    post, data, z = linear
    exact, count = _exact_table(post, data, z)
    pre, info = build_fourier(post, data, z, 64, jax.random.key(0))
    est = np.asarray(pre.table, np.float64)
    assert info["grad_evals"] == 128 and est.shape == exact.shape
    # Hutchinson's estimate is unbiased with a spread set by J^T J's few large eigenvalues:
    # measured over 40 keys at 16 probes, the table's total sum(count * d) / the exact has sd 0.17
    # (mean 1.07 +- 0.03), so 0.085 at 64; 0.3 is 3.5 of those
    assert abs((count * est).sum() / (count * exact).sum() - 1) < 0.3
    # the shape over bins: correlation 0.965-0.991 over 5 keys at 64 probes
    assert np.corrcoef(est.ravel(), exact.ravel())[0, 1] > 0.9
    # not trivial: the data dominate the prior in some bin, and leave most bins near 0
    assert exact.max() > 1 and np.mean(exact < 0.1) > 0.5

    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.normal(size=post.layout.size), jnp.float32) for _ in range(2))
    np.testing.assert_allclose(np.asarray(to_y(post, pre, to_z(post, pre, a))), np.asarray(a), atol=1e-5)
    ca = np.asarray(to_z(post, pre, a) - pre.ref, np.float64)
    cb = np.asarray(to_z(post, pre, b) - pre.ref, np.float64)
    # <a, C^1/2 b> = <C^1/2 a, b>: float32 sums of 2050 products of unit numbers
    np.testing.assert_allclose(np.dot(np.asarray(a), cb), np.dot(ca, np.asarray(b)), rtol=1e-4, atol=1e-3)
    # theta (the first entries of the tail) is not scaled
    np.testing.assert_allclose(np.asarray(post.layout.unpack(to_z(post, pre, a) - pre.ref)[0]),
                               np.asarray(post.layout.unpack(a)[0]), rtol=1e-6)


def test_bin_sums_recover_a_known_table(linear):
    from fli.infer.sample.precondition_fourier import bin_sums, filter_field, table_shape

    post, _, _ = linear
    grid = post.fwd.grid
    table = jnp.asarray(np.random.default_rng(1).uniform(0.0, 5.0, table_shape(post)), grid.jdtype)
    a = jnp.asarray(np.random.default_rng(2).normal(size=grid.shape), grid.jdtype)
    b = filter_field(post, table, a, 1.0) - a  # F^-1 [table F a]
    num, den = jax.jit(lambda a, b: bin_sums(post, a, b))(a, b)
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    filled = den > 0
    # every bin of the 8x8x32 grid holds a mode except corners of the transverse square
    assert filled.sum() >= 0.8 * filled.size
    np.testing.assert_allclose(num[filled] / den[filled], np.asarray(table, np.float64)[filled], rtol=1e-4)
