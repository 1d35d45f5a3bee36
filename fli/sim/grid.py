"""The simulation grid: static description shared by the LPT, PM and lensing stages.

A :class:`Grid` is hashable and static under ``jit`` (like pmwd's ``Configuration``): mesh
shape, box, device mesh, halo, FFT backend and dtype. Validation happens here, in plain
Python, before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import math
from functools import cached_property

import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from fli.sim.assignment import SCHEMES
from fli.sim.sharding import FIELD_SPEC, check_divisible, mesh_pdims


@dataclasses.dataclass(frozen=True)
class Grid:
    """One particle per cell of a periodic ``shape`` mesh over ``box``.

    Attributes:
        shape: cells ``(nx, ny, nz)``.
        box: side lengths ``(Lx, Ly, Lz)`` [Mpc/h].
        mesh: the ``('x', 'y')`` device mesh; fields are sharded ``P('x', 'y')``.
        halo: padding [cells] of the local blocks for painting and reading.
        fft_backend: ``"pencil"`` (default) or ``"jaxdecomp"``.
        dtype: ``"float32"`` or ``"float64"``.
        force_correction: coefficient ``c`` of the PM force's resolution correction
            ``1 + c sum_i (k_i h_i)^2`` (:func:`fli.sim.fft.force_correction_kernel`); 0 turns it
            off. The default 1/4 makes large-scale growth at one particle per cell match linear
            theory (see docs/benchmarks.md, "Large-scale growth").
        assignment: the mass assignment of the PM force and the density, ``"cic"`` (default) or
            ``"tsc"`` (:mod:`fli.sim.assignment`: a continuous derivative in the positions). TSC's
            read smooths the force by ``(k h)^2 / 8`` where CIC's does by ``(k h)^2 / 12``, so
            the correction the PM applies is :attr:`force_coefficient`, ``c`` scaled to TSC.
    """

    shape: tuple[int, int, int]
    box: tuple[float, float, float]
    mesh: Mesh
    halo: int = 4
    fft_backend: str = "pencil"
    dtype: str = "float32"
    force_correction: float = 0.25
    assignment: str = "cic"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        object.__setattr__(self, "box", tuple(float(b) for b in self.box))
        if len(self.shape) != 3 or min(self.shape) < 2:
            raise ValueError(f"mesh shape must be three integers >= 2, got {self.shape}")
        if len(self.box) != 3 or not all(math.isfinite(b) and b > 0 for b in self.box):
            raise ValueError(f"box must be three positive lengths [Mpc/h], got {self.box}")
        check_divisible(self.shape, mesh_pdims(self.mesh))
        bx, by = self.local_shape[:2]
        if not 1 <= self.halo <= min(bx, by):
            raise ValueError(
                f"halo {self.halo} must be between 1 and the local block size {min(bx, by)} cells "
                f"(mesh {self.shape} over pdims {mesh_pdims(self.mesh)})"
            )
        object.__setattr__(self, "force_correction", float(self.force_correction))
        if not (math.isfinite(self.force_correction) and self.force_correction >= 0):
            raise ValueError(f"force_correction must be a finite number >= 0, got {self.force_correction}")
        if self.assignment not in SCHEMES:
            raise ValueError(f"mass assignment must be one of {SCHEMES}, got {self.assignment!r}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")

    def __hash__(self) -> int:  # cached_property needs a __dict__; hash the defining fields only
        return hash(self._key())

    def _key(self) -> tuple:
        return (self.shape, self.box, self.mesh, self.halo, self.fft_backend, self.dtype, self.force_correction,
                self.assignment)

    def __eq__(self, other) -> bool:
        return isinstance(other, Grid) and self._key() == other._key()

    @property
    def force_coefficient(self) -> float:
        """The coefficient the PM force's correction uses: ``force_correction`` for CIC; for TSC
        scaled by 7/6, the ratio of the force's deficits, ``1/6 + 1/8`` (the lattice's central
        difference, TSC's read) against ``1/6 + 1/12`` (CIC's read), so that the default 1/4
        becomes 7/24 (measured: large-scale growth within 0.6% of linear theory with it, 1.6% low
        without; docs/benchmarks.md, "TSC against CIC")."""
        return self.force_correction * (7.0 / 6.0 if self.assignment == "tsc" else 1.0)

    @property
    def pdims(self) -> tuple[int, int]:
        return mesh_pdims(self.mesh)

    @property
    def local_shape(self) -> tuple[int, int, int]:
        px, py = self.pdims
        return (self.shape[0] // px, self.shape[1] // py, self.shape[2])

    @property
    def cell(self) -> np.ndarray:
        """Cell sizes ``(Lx/nx, Ly/ny, Lz/nz)`` [Mpc/h]."""
        return np.asarray(self.box) / np.asarray(self.shape)

    @property
    def cell_volume(self) -> float:
        return float(np.prod(self.cell))

    @property
    def n_cells(self) -> int:
        return int(np.prod(self.shape))

    @property
    def jdtype(self):
        return jnp.dtype(self.dtype)

    @property
    def sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, FIELD_SPEC)

    @cached_property
    def fft(self):
        """The FFT plan of this grid (k-space layout and transforms)."""
        from fli.sim.fft import make_fft  # noqa: PLC0415

        return make_fft(self.mesh, self.shape, backend=self.fft_backend)
