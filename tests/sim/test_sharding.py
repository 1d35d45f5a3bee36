"""Device mesh helpers and the layout-independent white noise."""

import jax
import numpy as np
import pytest

from fli.sim.sharding import detect_launcher, field_sharding, make_mesh, parse_pdims, white_noise
from tests.helpers.physics import LAYOUTS


def test_white_noise_bitwise_identical_on_every_layout():
    shape = (16, 8, 12)  # non-cubic, divisible by every layout
    ref = np.asarray(white_noise(7, shape, make_mesh((1, 1))))
    for pd in LAYOUTS[1:]:
        mesh = make_mesh(pd)
        w = white_noise(7, shape, mesh)
        assert w.sharding.is_equivalent_to(field_sharding(mesh), 3)
        np.testing.assert_array_equal(np.asarray(w), ref)  # bitwise: same draws per column
    # it is noise: mean ~ 0, std ~ 1 within 5 sigma of sampling error for 1536 draws
    assert abs(ref.mean()) < 5 / np.sqrt(ref.size)
    assert abs(ref.std() - 1) < 5 / np.sqrt(2 * ref.size)
    # a different seed gives a different field
    assert not np.array_equal(ref, np.asarray(white_noise(8, shape, make_mesh((1, 1)))))


def test_white_noise_float64_layout_independent():
    with jax.enable_x64(True):
        a = np.asarray(white_noise(1, (8, 8, 5), make_mesh((1, 1)), dtype=np.float64))
        b = np.asarray(white_noise(1, (8, 8, 5), make_mesh((2, 4)), dtype=np.float64))
    assert a.dtype == np.float64
    np.testing.assert_array_equal(a, b)


def test_mesh_errors():
    with pytest.raises(ValueError, match=r"pdims \(4, 4\) needs 16 devices, found 8"):
        make_mesh((4, 4))
    with pytest.raises(ValueError, match="not divisible by pdims"):
        white_noise(0, (6, 8, 4), make_mesh((4, 2)))
    with pytest.raises(ValueError, match="pdims must be two positive integers"):
        parse_pdims("2x")
    assert parse_pdims("2x4") == (2, 4)
    m = make_mesh((2, 4))
    assert m.axis_names == ("x", "y") and m.devices.shape == (2, 4)


def test_detect_launcher():
    assert detect_launcher({}) is None
    assert detect_launcher({"SLURM_NTASKS": "4", "SLURM_PROCID": "1"}) == "slurm"
    assert detect_launcher({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None
    assert detect_launcher({"OMPI_COMM_WORLD_SIZE": "2"}) == "mpi"
