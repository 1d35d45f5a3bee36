"""Device mesh, distributed start-up, process-aware logging and layout-independent noise.

Conventions used by every other module:

* the device mesh is 2D with axis names ``('x', 'y')`` and shape ``pdims``, built with
  ``AxisType.Auto`` axes (jaxdecomp 0.3.1 fails on explicit-mode meshes with jax >= 0.9);
* a 3D field ``[nx, ny, nz]`` is sharded ``P('x', 'y')``: axis 0 over mesh axis ``x``,
  axis 1 over ``y``, axis 2 (the line of sight) local to each device;
* one device is the mesh ``(1, 1)``: there is one code path.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ("x", "y")
FIELD_SPEC = P("x", "y")

def parse_pdims(pdims: str | Sequence[int]) -> tuple[int, int]:
    """``"2x4"``, ``(2, 4)`` or ``[2, 4]`` -> ``(2, 4)``; raises ``ValueError`` otherwise."""
    if isinstance(pdims, str):
        parts = pdims.lower().split("x")
    else:
        parts = list(pdims)
    try:
        out = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        out = ()
    if len(out) != 2 or min(out) < 1:
        raise ValueError(f"pdims must be two positive integers such as 2x4, got {pdims!r}")
    return out  # type: ignore[return-value]


def make_mesh(pdims: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Build the ``('x', 'y')`` device mesh of shape ``pdims``.

    With several processes the mesh must use every device of every process; in one process
    it takes the first ``px * py`` devices.
    """
    px, py = parse_pdims(pdims)
    devices = list(jax.devices() if devices is None else devices)
    need = px * py
    if need > len(devices):
        raise ValueError(f"pdims ({px}, {py}) needs {need} devices, found {len(devices)}")
    if jax.process_count() > 1 and need != len(devices):
        raise ValueError(
            f"pdims ({px}, {py}) uses {need} devices but {len(devices)} exist across "
            f"{jax.process_count()} processes: a multi-process mesh must use them all"
        )
    dev = np.asarray(devices[:need]).reshape(px, py)
    return Mesh(dev, AXES, axis_types=(AxisType.Auto, AxisType.Auto))


def field_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of 3D fields ``[nx, ny, nz]`` and 2D maps ``[nx, ny]``: ``P('x', 'y')``."""
    return NamedSharding(mesh, FIELD_SPEC)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def field_leaf_shardings(tree, mesh: Mesh, shape: Sequence[int]):
    """Shardings for a pytree of arrays (or shapes): every leaf whose trailing dimensions are the
    field ``shape`` sharded like the field (leading axes, such as L-BFGS's memory or a chain
    axis, unsharded), everything else replicated. For states built from the field (an
    optimiser's moments, a sampler's state), which would otherwise land on one device."""
    shape, rep = tuple(shape), NamedSharding(mesh, P())

    def one(x):
        sh = tuple(np.shape(x))
        if len(sh) >= 3 and sh[-3:] == shape:
            return NamedSharding(mesh, P(*([None] * (len(sh) - 3)), *FIELD_SPEC))
        return rep

    return jax.tree.map(one, tree)


def hlo_collectives(hlo: str):
    """Count of every all-gather / all-reduce / all-to-all in compiled HLO text, keyed by
    ``(op, element count of its largest result)``: how tests and benchmarks check that a
    compiled program keeps the field sharded."""
    import re  # noqa: PLC0415
    from collections import Counter  # noqa: PLC0415

    out = Counter()
    for line in hlo.splitlines():
        m = re.search(r"=\s*(.*?)\s+(all-gather|all-reduce|all-to-all)(-start)?\(", line)
        if m:
            shapes = re.findall(r"[a-z]+[0-9]*\[([0-9,]*)\]", m.group(1))
            out[(m.group(2), max(math.prod(int(d) for d in s.split(",") if d) for s in shapes))] += 1
    return out


def mesh_pdims(mesh: Mesh) -> tuple[int, int]:
    return int(mesh.shape["x"]), int(mesh.shape["y"])


def check_divisible(shape: Sequence[int], pdims: Sequence[int], what: str = "mesh") -> None:
    """Raise ``ValueError`` unless axis 0 divides by ``px`` and axis 1 by ``py``."""
    px, py = pdims
    nx, ny = shape[0], shape[1]
    if nx % px or ny % py:
        raise ValueError(
            f"{what} {tuple(shape)} is not divisible by pdims ({px}, {py}): "
            f"need {what}[0] % {px} == 0 and {what}[1] % {py} == 0"
        )


# --------------------------------------------------------------------------- distributed


def detect_launcher(env: dict[str, str] | None = None) -> str | None:
    """Name the multi-process launcher found in the environment: 'slurm', 'mpi' or None."""
    env = dict(os.environ) if env is None else env
    if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in env:
        return "slurm"
    if int(env.get("OMPI_COMM_WORLD_SIZE", env.get("PMI_SIZE", "1"))) > 1:
        return "mpi"
    return None


def init_distributed(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_count: int | None = None,
) -> bool:
    """Initialise ``jax.distributed`` before any device use; returns True if it did.

    With an explicit ``coordinator`` (``"host:port"``), ``num_processes`` and ``process_id``
    those are used (also read from ``FLI_COORDINATOR``, ``FLI_NUM_PROCESSES``,
    ``FLI_PROCESS_ID``). Otherwise SLURM ``srun`` and Open MPI ``mpirun`` are auto-detected and
    ``jax.distributed.initialize()`` finds its own arguments. A single plain process does nothing.
    ``local_device_count`` sets the number of CPU devices per process (CPU only).

    A process that dies (killed, out of memory, node lost) stops the others within about
    ``FLI_HEARTBEAT_TIMEOUT`` seconds (default :data:`HEARTBEAT_TIMEOUT`, jax's own is 100):
    jax's coordination service marks a process dead when its heartbeats stop and then
    terminates every other process with "Terminating process because the JAX distributed
    service detected fatal errors" (and "Task <i> heartbeat timeout" on process 0); a peer
    blocked in a collective (NCCL, gloo) would otherwise wait for ever. Measured on 2 CPU
    processes (gloo), timeout 10 s: process 1 killed -> process 0 out (SIGABRT) 9-10 s later;
    process 0 (the coordinator) killed -> process 1 out within ~1 s.
    """
    coordinator = coordinator or os.environ.get("FLI_COORDINATOR")
    if num_processes is None and "FLI_NUM_PROCESSES" in os.environ:
        num_processes = int(os.environ["FLI_NUM_PROCESSES"])
    if process_id is None and "FLI_PROCESS_ID" in os.environ:
        process_id = int(os.environ["FLI_PROCESS_ID"])
    if local_device_count:
        jax.config.update("jax_num_cpu_devices", int(local_device_count))
    if coordinator:
        if num_processes is None or process_id is None:
            raise ValueError(
                "distributed.coordinator is set: distributed.num_processes and "
                "distributed.process_id must be set too"
            )
        if not _initialised():
            jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id,
                                       heartbeat_timeout_seconds=heartbeat_timeout())
        return True
    launcher = detect_launcher()
    if launcher is not None and not _initialised():
        # jax's cluster auto-detection reads SLURM_* (srun) and OMPI_* (mpirun) variables.
        jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout())
        return True
    return False


HEARTBEAT_TIMEOUT = 30  # [s] a process silent for this long is dead and the run stops


def heartbeat_timeout(env: dict[str, str] | None = None) -> int:
    """Seconds without heartbeats after which jax.distributed declares a process dead:
    ``FLI_HEARTBEAT_TIMEOUT`` if set (a positive integer), else :data:`HEARTBEAT_TIMEOUT`."""
    env = os.environ if env is None else env
    raw = env.get("FLI_HEARTBEAT_TIMEOUT")
    if raw is None:
        return HEARTBEAT_TIMEOUT
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"FLI_HEARTBEAT_TIMEOUT must be a positive number of seconds, got {raw!r}")
    return value


def _initialised() -> bool:
    try:
        from jax._src import distributed as _d  # noqa: PLC0415

        return _d.global_state.client is not None
    except Exception:  # pragma: no cover - private API moved
        return False


class _Rank0Filter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:  # noqa: D401
        return jax.process_index() == 0 or record.levelno >= logging.WARNING


def get_logger(name: str = "fli") -> logging.Logger:
    """A logger that prints INFO only on process 0 (warnings and errors on every process)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, _Rank0Filter) for f in logger.filters):
        logger.addFilter(_Rank0Filter())
    return logger


# --------------------------------------------------------------------------- white noise


def _column_noise(key: jax.Array, ix: jax.Array, iy: jax.Array, nz: int, dtype) -> jax.Array:
    k = jax.random.fold_in(jax.random.fold_in(key, ix), iy)
    return jax.random.normal(k, (nz,), dtype=dtype)


def white_noise(
    seed: int | jax.Array,
    shape: Sequence[int],
    mesh: Mesh,
    dtype=jnp.float32,
) -> jax.Array:
    """Unit Gaussian white noise ``[nx, ny, nz]`` sharded ``P('x', 'y')``.

    Each line-of-sight column ``(i, j)`` is drawn from ``fold_in(fold_in(key, i), j)``, so the
    field is bitwise the same whatever ``pdims`` and however many processes: every device
    draws only its own columns.
    """
    nx, ny, nz = (int(s) for s in shape)
    px, py = mesh_pdims(mesh)
    check_divisible(shape, (px, py))
    bx, by = nx // px, ny // py
    key = jax.random.key(seed) if isinstance(seed, int) else seed

    def local(key):
        i0 = jax.lax.axis_index("x") * bx
        j0 = jax.lax.axis_index("y") * by
        ix = i0 + jnp.arange(bx)
        iy = j0 + jnp.arange(by)
        f = jax.vmap(jax.vmap(_column_noise, (None, None, 0, None, None)), (None, 0, None, None, None))
        return f(key, ix, iy, nz, dtype)

    fn = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=P(), out_specs=FIELD_SPEC, check_vma=False)
    )
    return fn(key)


def process_allgather(x: jax.Array) -> np.ndarray:
    """The whole of a (possibly non-addressable) sharded array as numpy, on every process."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    from jax.experimental import multihost_utils  # noqa: PLC0415

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def replicated_to_host(x) -> np.ndarray:
    """A replicated (or fully addressable) array as numpy on every process, without a
    collective: a replicated array's first local copy is the whole of it."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(x.addressable_data(0))
    return np.asarray(x)


def n_devices_needed(pdims: Sequence[int]) -> int:
    return math.prod(parse_pdims(pdims))


def to_field(x: jax.Array, mesh: Mesh) -> jax.Array:
    """A replicated ``[nx, ny, ...]`` array (e.g. a NumPyro latent) as a field sharded ``P('x','y')``.

    Each device slices its own block inside ``shard_map``. Going straight from a replicated
    array into the FFT with ``with_sharding_constraint`` is one of the patterns that crash
    XLA's CPU FFT inside NUTS; this is the one that works.
    """
    px, py = mesh_pdims(mesh)
    check_divisible(x.shape, (px, py), "field")
    bx, by = x.shape[0] // px, x.shape[1] // py

    def local(x):
        i, j = jax.lax.axis_index("x") * bx, jax.lax.axis_index("y") * by
        start = (i, j) + (0,) * (x.ndim - 2)
        return jax.lax.dynamic_slice(x, start, (bx, by, *x.shape[2:]))

    return jax.shard_map(local, mesh=mesh, in_specs=P(), out_specs=FIELD_SPEC, check_vma=False)(x)
