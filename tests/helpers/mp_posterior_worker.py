"""Worker for tests/infer/posterior/test_model.py: one of N processes (2 CPU devices each) evaluating the
small posterior's value and gradient on pdims (2, 2).  usage: PORT NPROC PID OUT.npz"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

port, nproc, pid, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
jax.config.update("jax_num_cpu_devices", 2)
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)

import numpy as np  # noqa: E402

from fli.sim.sharding import process_allgather  # noqa: E402
from tests.helpers.posterior import small_posterior  # noqa: E402

post, data, lat = small_posterior((2, 2))
(u, _), g = post.value_and_grad()(lat, data)
gs = process_allgather(g.s)
if pid == 0:
    np.savez(out, u=np.asarray(u), g_theta=np.asarray(g.theta), g_s=gs)
print(f"process {pid}: {jax.process_count()} processes, {jax.device_count()} devices, ok", flush=True)
