"""Test settings: 8 virtual CPU devices (set before jax is imported), strict JAX checks."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "allow")
# JAX's persistent compilation cache: tests that build the same small posterior (and the slow
# tests that CI runs after the default ones) reuse compiled programs instead of recompiling
_CACHE = os.environ.get("FLI_TEST_JAX_CACHE", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "jax"))
jax.config.update("jax_compilation_cache_dir", os.path.abspath(_CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


@pytest.fixture(scope="session")
def n_devices() -> int:
    return jax.device_count()


LAYOUTS = [(1, 1), (2, 2), (2, 4), (1, 8), (8, 1)]


def ccl_cosmology(c, power: str = "linear"):
    """The pyccl twin of a fli Cosmology: Eisenstein-Hu transfer, no radiation or neutrinos
    (as fli), ``power`` "linear" or "halofit". pyccl is a test dependency."""
    import pyccl  # noqa: PLC0415

    return pyccl.Cosmology(Omega_c=c.Omega_c, Omega_b=c.Omega_b, h=c.h, n_s=c.n_s, sigma8=c.sigma8,
                           w0=c.w0, wa=c.wa, Omega_g=0.0, Neff=0.0, m_nu=0.0,
                           transfer_function="eisenstein_hu", matter_power_spectrum=power)
