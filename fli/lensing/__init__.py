"""From the simulation to convergence maps: the source n(z) bins and shape noise (``survey``),
the light cone's planes and crossing times (``light_cone``), the Born projection of lens planes
painted from the mesh (``born``) or from the particles onto the pixels (``particle_planes``),
and Limber's C_ell, the reference the maps are held against (``limber``). Flat sky."""

from fli.lensing.born import born_convergence, lensing_kernel  # noqa: F401
from fli.lensing.light_cone import LensGeometry, lens_geometry  # noqa: F401
from fli.lensing.limber import limber_cl, map_power_spectrum  # noqa: F401
from fli.lensing.survey import NzBin, nz_bins_from_config  # noqa: F401
