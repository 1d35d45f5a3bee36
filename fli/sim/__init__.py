"""The distributed particle-mesh simulation: the device mesh and its sharding (``sharding``,
``host``), the pencil FFT (``fft``), halo exchanges (``halo``), mass assignment and painting
(``assignment``, ``painting``), the grid (``grid``), 2LPT (``lpt``), the FastPM scan with its
adjoints (``nbody``), the PGD shift (``pgd``), power spectra (``power``) and white-noise
refinement (``refine``). Fields are sharded ``P('x', 'y')``; lengths in Mpc/h, k in h/Mpc."""

from fli.sim.grid import Grid  # noqa: F401
from fli.sim.nbody import density, simulate  # noqa: F401
from fli.sim.power import power_spectrum  # noqa: F401
from fli.sim.sharding import make_mesh, white_noise  # noqa: F401
