"""Device layouts and reference-code twins shared by the physics tests."""

# every 2D device mesh of the 8 virtual CPU devices that a sharded test is run on
LAYOUTS = [(1, 1), (2, 2), (2, 4), (1, 8), (8, 1)]


def ccl_cosmology(c, power: str = "linear"):
    """The pyccl twin of a fli Cosmology: Eisenstein-Hu transfer, no massive neutrinos, and
    radiation as in ``c`` (photons at ``c.T_cmb`` and ``c.N_eff`` massless species, CCL's own
    count; or none: ``Omega_g = 0``, ``Neff = 0``); ``power`` "linear" or "halofit". pyccl is
    a test dependency."""
    import pyccl  # noqa: PLC0415

    rad = dict(T_CMB=c.T_cmb, Neff=c.N_eff) if c.radiation else dict(Omega_g=0.0, Neff=0.0, T_CMB=c.T_cmb)
    return pyccl.Cosmology(Omega_c=c.Omega_c, Omega_b=c.Omega_b, h=c.h, n_s=c.n_s, sigma8=c.sigma8,
                           w0=c.w0, wa=c.wa, m_nu=0.0, transfer_function="eisenstein_hu",
                           matter_power_spectrum=power, **rad)
