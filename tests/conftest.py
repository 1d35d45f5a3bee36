"""Test settings: 8 virtual CPU devices (set before jax is imported), strict JAX checks."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "allow")


@pytest.fixture(scope="session")
def n_devices() -> int:
    return jax.device_count()


LAYOUTS = [(1, 1), (2, 2), (2, 4), (1, 8), (8, 1)]
