"""Worker for test_multiprocess: one of 2 processes (2 CPU devices each) whose process 1 reaches
a compiled program's collective ``LATE`` seconds after process 0, with fli's barrier between.

usage: python late_peer_worker.py PORT NPROC PID OUT.npy
"""

import os
import sys
import time

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

from fli.sim.sharding import init_distributed  # noqa: E402

LATE = 35.0  # [s] longer than gloo's 30 s wait for a peer

port, nproc, pid, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
init_distributed(f"127.0.0.1:{port}", nproc, pid, local_device_count=2)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from fli.store.files import barrier  # noqa: E402

mesh = Mesh(np.array(jax.devices()), ("x",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), jnp.full(2, pid + 1.0))
total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P())).lower(x).compile()
if pid == 1:
    time.sleep(LATE)  # as a peer still compiling, or process 0 still writing
t0 = time.monotonic()
barrier("late-peer")
waited = time.monotonic() - t0
value = float(total(x))  # the first collective: 1 + 1 + 2 + 2 over the 4 devices of 2 processes
if pid == 0:
    np.save(out, np.array([value, waited]))
print(f"process {pid}: {jax.process_count()} processes, {jax.device_count()} devices, waited {waited:.1f} s, "
      f"sum {value}", flush=True)
