"""Second derivatives of the PM forward model: Hessian-vector products against finite differences.

The Laplace step needs ``H v`` of a scalar ``U(theta, s)`` through the whole forward model.
JAX forms it forward-over-reverse (``jvp`` of ``grad``) or reverse-over-reverse (``grad`` of
``<grad U, v>``); both are compared with central differences of the gradient,
``(grad U(x + eps v) - grad U(x - eps v)) / (2 eps)``, in float64.

CIC is piecewise multilinear in the positions: smooth inside a cell, with a jump of the first
derivative at each cell edge. Each test keeps every particle in the same cell at
``x - eps v`` and ``x + eps v``, at every force evaluation: by construction for the CIC and PM
force tests (fractional positions at least 0.05 cells from an edge, ``eps |v|`` below 1e-4
cells), and checked for the simulations (the cells of every particle at every step agree at
both ends). Both differences then lie on one polynomial piece and are exact up to
``O(eps^2)`` truncation and ``1e-16 / eps`` rounding.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fli.sim import assignment
from fli.sim import painting
from fli.cosmo.background import planck18
from fli.sim.grid import Grid
from fli.sim.nbody import density, initial_state, nbody, pm_force
from fli.sim.sharding import make_mesh, white_noise

SHAPE, BOX, HALO = (8, 8, 8), (100.0, 100.0, 100.0), 2
EPS = 1e-5
# Central differences on one smooth piece: truncation eps^2 U''' / U'' ~ 1e-10 and rounding
# 1e-16 / eps ~ 1e-11 relative to the gradient; measured 1e-11 .. 1e-9. 1e-6 leaves three
# orders of margin, while a missing second-derivative term fails by orders of magnitude (the
# stencil's positions held constant in the adjoints: 0.1-0.4 relative error).
RTOL = 1e-6
# The two modes compute the same derivatives in a different order: float64 rounding only.
MODES_RTOL = 1e-10


def _tree_axpy(a, x, y):
    return jax.tree.map(lambda u, w: u + a * w, y, x)


def _vdot(x, y):
    return sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y), strict=True))


def _rel(a, b):
    """Largest over the leaves of ``|a - b| / |b|`` (2-norms)."""
    return max(float(jnp.linalg.norm(jnp.ravel(u - w)) / jnp.linalg.norm(jnp.ravel(w)))
               for u, w in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


MODES = ("reverse", "forward")


def _check_hvp(U, z, v, modes=MODES, has_aux=False):
    """HVPs of ``U`` at ``z`` along ``v`` (reverse-over-reverse and / or forward-over-reverse)
    against central differences of the gradient. With ``has_aux``, ``U`` returns
    ``(value, aux)``; returns the aux at ``z - eps v`` and ``z + eps v``."""
    grad_aux = jax.grad(U, has_aux=True) if has_aux else lambda z: (jax.grad(U)(z), None)

    def grad(z):
        return grad_aux(z)[0]

    @jax.jit
    def hvps(z, v):
        out = {}
        if "reverse" in modes:
            out["reverse"] = jax.grad(lambda z: _vdot(grad(z), v))(z)
        if "forward" in modes:
            out["forward"] = jax.jvp(grad, (z,), (v,))[1]
        return out

    g = jax.jit(grad_aux)
    (g_hi, aux_hi), (g_lo, aux_lo) = g(_tree_axpy(EPS, v, z)), g(_tree_axpy(-EPS, v, z))
    fd = jax.tree.map(lambda a, b: (a - b) / (2 * EPS), g_hi, g_lo)
    h = hvps(z, v)
    errs = {m: _rel(hm, fd) for m, hm in h.items()}
    assert max(errs.values()) < RTOL, errs
    if len(h) == 2:
        assert _rel(h["forward"], h["reverse"]) < MODES_RTOL, _rel(h["forward"], h["reverse"])
    return aux_lo, aux_hi


def _put(x, mesh, spec=P("x", "y")):
    return jax.device_put(jnp.asarray(x), NamedSharding(mesh, spec))


def _cells_off_edges(rng, shape, halo, margin=0.05):
    """Displacements [cells] with fractional parts in [margin, 1 - margin] and |dx|, |dy| below
    the halo (no clipping); dz over several cells."""
    d = rng.uniform(-halo, halo, shape + (3,))
    d[..., 2] = rng.uniform(-3.0, 3.0, shape)
    base = np.floor(d)
    return base + np.clip(d - base, margin, 1 - margin)


def _cosmo(omega_c):
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), planck18().replace(Omega_c=omega_c))


# --------------------------------------------------------------------------- CIC kernels


@pytest.mark.parametrize(("exchange", "pdims"), [
    ("jaxdecomp", (1, 2)),
    pytest.param("jaxdecomp", (2, 2), marks=pytest.mark.slow(seconds=15)),
    pytest.param("ppermute", (2, 2), marks=pytest.mark.slow(seconds=15)),
])
@pytest.mark.slow(seconds=15)
def test_cic_hvp_positions_masses_field(exchange, pdims, monkeypatch):
    """Mixed second derivatives of the paint (positions x masses) and of the read (positions x
    field), with the read's tangent split into slabs of one x row. The default run takes the
    jaxdecomp exchange (linear maps with a declared transpose) on a slab mesh (its pencil
    fold compiles 2x slower); the PM tests below go through the ppermute one on (2, 2)."""
    mesh = make_mesh(pdims)
    monkeypatch.setattr(assignment, "CHUNK_PARTICLES", 1)  # slabs of one x row
    jax.clear_caches()
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        a = _put(rng.normal(size=SHAPE), mesh)
        z = (_put(_cells_off_edges(rng, SHAPE, HALO - 0.2), mesh), _put(rng.uniform(0.5, 2.0, SHAPE), mesh),
             _put(rng.normal(size=(3,) + SHAPE), mesh, P(None, "x", "y")))
        v = (_put(rng.normal(size=SHAPE + (3,)), mesh), _put(rng.normal(size=SHAPE), mesh),
             _put(rng.normal(size=(3,) + SHAPE), mesh, P(None, "x", "y")))

        def U(z):
            d, w, f = z
            rho = painting.paint(d, mesh, HALO, w, exchange=exchange)
            r = painting.read(f, d, mesh, HALO, exchange=exchange)
            return jnp.sum(a * rho**2) + jnp.sum(r**2 * rho[..., None])

        _check_hvp(U, z, v)


def test_tsc_hvp_positions_masses_field(monkeypatch):
    """TSC's second derivatives (fli/sim/assignment.py's tangent rules differentiated again, as the
    Laplace errors and the preconditioner do), on one device with slabs of one x row: the same
    check as CIC's above, positions kept off TSC's piece edges (half-integer offsets). 8 s here,
    in the default set: CIC's runs in the slow one."""
    mesh = make_mesh((1, 1))
    monkeypatch.setattr(assignment, "CHUNK_PARTICLES", 1)  # slabs of one x row
    jax.clear_caches()
    rng = np.random.default_rng(2)
    with jax.enable_x64(True):
        a = _put(rng.normal(size=SHAPE), mesh)
        z = (_put(_cells_off_edges(rng, SHAPE, HALO - 1.1) - 0.5, mesh), _put(rng.uniform(0.5, 2.0, SHAPE), mesh),
             _put(rng.normal(size=(3,) + SHAPE), mesh, P(None, "x", "y")))
        v = (_put(rng.normal(size=SHAPE + (3,)), mesh), _put(rng.normal(size=SHAPE), mesh),
             _put(rng.normal(size=(3,) + SHAPE), mesh, P(None, "x", "y")))

        def U(z):
            d, w, f = z
            rho = painting.paint(d, mesh, HALO, w, scheme="tsc")
            r = painting.read(f, d, mesh, HALO, scheme="tsc")
            return jnp.sum(a * rho**2) + jnp.sum(r**2 * rho[..., None])

        _check_hvp(U, z, v)


# --------------------------------------------------------------------------- PM force


@pytest.mark.slow(seconds=10)
@pytest.mark.parametrize("pdims", [(1, 1), (2, 2)])
def test_pm_force_hvp_displacements_and_omega_c(pdims):
    grid = Grid(SHAPE, BOX, make_mesh(pdims), halo=HALO, dtype="float64")
    rng = np.random.default_rng(1)
    with jax.enable_x64(True):
        cell = np.asarray(grid.cell)
        w = _put(rng.normal(size=SHAPE + (3,)), grid.mesh)
        # eps |v| < 1e-4 Mpc/h, below 1e-5 cells: no particle leaves its cell
        z = (jnp.float64(0.26), _put(_cells_off_edges(rng, SHAPE, HALO - 0.2) * cell, grid.mesh))
        v = (jnp.float64(0.8), _put(rng.normal(size=SHAPE + (3,)), grid.mesh))

        def U(z):
            force, dens = pm_force(_cosmo(z[0]), z[1], grid)
            return jnp.sum(dens.rho**3) + jnp.sum(force * w) + jnp.sum(force**2)

        _check_hvp(U, z, v)


# --------------------------------------------------------------------------- simulations


def _check_simulation_hvp(pdims, adjoint, param, value, lpt_order, modes):
    """HVP of ``U(theta, s) = sum(w rho^2) + |s|^2 / 2`` (``rho`` the density after 2 FastPM
    steps from LPT at a = 0.2, i.e. :func:`fli.sim.nbody.simulate`) with respect to the white
    noise ``s`` and the cosmological parameter ``param``; checks that no particle changes
    cell between the two ends of the differences."""
    grid = Grid(SHAPE, BOX, make_mesh(pdims), halo=HALO, dtype="float64")
    a_steps = np.array([0.2, 0.5, 1.0])
    with jax.enable_x64(True):
        cell = jnp.asarray(grid.cell)
        w = white_noise(2, SHAPE, grid.mesh, dtype=jnp.float64)
        z = (jnp.float64(value), white_noise(0, SHAPE, grid.mesh, dtype=jnp.float64))
        v = (jnp.float64(0.7), white_noise(1, SHAPE, grid.mesh, dtype=jnp.float64))

        def U(z):
            cosmo = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), planck18().replace(**{param: z[0]}))
            st0 = initial_state(cosmo, z[1], grid, a_steps[0], lpt_order)  # simulate(), opened up
            st, cells, maxd = nbody(cosmo, st0, jnp.asarray(a_steps), grid, adjoint=adjoint,
                                    hook=lambda rho, disp, a, i: jnp.floor(disp / cell))
            value = jnp.sum(w * density(st.disp, grid) ** 2) + 0.5 * jnp.sum(z[1] ** 2)
            # the cell of every particle at every force evaluation, and the largest displacement
            return value, (jnp.floor(st0.disp / cell), cells, maxd)

        lo, hi = _check_hvp(U, z, v, modes, has_aux=True)
        for c_lo, c_hi in zip(lo[:2], hi[:2], strict=True):  # the differences saw one CIC piece
            np.testing.assert_array_equal(np.asarray(c_lo), np.asarray(c_hi))
        assert float(jnp.max(hi[2])) < HALO  # and no clipping at the halo edge


# Compiling a second-order program of the whole simulation takes 10-60 s here, most of it in
# the cosmology (growth ODE, power spectrum) when differentiated twice in Omega_c, so these
# are all in the slow set: one mode per adjoint, the two that failed before
# (reverse-over-reverse through the checkpointed scan, forward-over-reverse through the
# reversible custom VJP), with
# sigma8 (which enters through the LPT amplitude, not the growth ODE), Zel'dovich initial
# conditions and one device; the slow one checks both modes, Omega_c, 2LPT on a (2, 2) mesh.


@pytest.mark.slow(seconds=15)
@pytest.mark.parametrize(("adjoint", "mode"), [("checkpoint", "reverse"), ("reversible", "forward")])
def test_simulation_hvp_white_noise_and_sigma8(adjoint, mode):
    _check_simulation_hvp((1, 1), adjoint, "sigma8", 0.81, 1, (mode,))


# The default adjoint only: the checkpointed one compiled for another 200 s in a fresh-clone CI
# run on a slow day, and its second order is checked above (reverse-over-reverse, sigma8).
@pytest.mark.slow(seconds=165)  # fresh-clone CI of 469bd9a: 163 s
def test_simulation_hvp_white_noise_and_omega_c_sharded():
    _check_simulation_hvp((2, 2), "reversible", "Omega_c", 0.26, 2, MODES)
