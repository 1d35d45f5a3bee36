"""Worker for test_multiprocess: one of N processes (2 CPU devices each) of a distributed run.

usage: python mp_forward_worker.py PORT NPROC PID OUT.npy
"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

port, nproc, pid, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
jax.config.update("jax_num_cpu_devices", 2)
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)

import numpy as np  # noqa: E402

from fli.cosmo.background import planck18  # noqa: E402
from fli.lensing.light_cone import _host_chi_of_z  # noqa: E402
from fli.sim.sharding import process_allgather  # noqa: E402
from tests.helpers.processes import forward_density  # noqa: E402

# host-side float64 (fli.sim.host.cpu_float64) on every rank: each on its own CPU device
chi = float(_host_chi_of_z(planck18(), np.array([1.0]))[0])
rho = process_allgather(forward_density((2, 2)))
if pid == 0:
    np.save(out, rho)
print(f"process {pid}: {jax.process_count()} processes, {jax.device_count()} devices, chi(z=1) {chi:.6f}, ok",
      flush=True)
