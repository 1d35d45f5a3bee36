"""Device layouts and reference-code twins shared by the physics tests."""

# every 2D device mesh of the 8 virtual CPU devices that a sharded test is run on
LAYOUTS = [(1, 1), (2, 2), (2, 4), (1, 8), (8, 1)]


def ccl_cosmology(c, power: str = "linear"):
    """The pyccl twin of a fli Cosmology: Eisenstein-Hu transfer, no radiation or neutrinos
    (as fli), ``power`` "linear" or "halofit". pyccl is a test dependency."""
    import pyccl  # noqa: PLC0415

    return pyccl.Cosmology(Omega_c=c.Omega_c, Omega_b=c.Omega_b, h=c.h, n_s=c.n_s, sigma8=c.sigma8,
                           w0=c.w0, wa=c.wa, Omega_g=0.0, Neff=0.0, m_nu=0.0,
                           transfer_function="eisenstein_hu", matter_power_spectrum=power)
