#!/usr/bin/env bash
# Open MPI: mpirun -n N starts N processes; jax.distributed reads OMPI_* to initialise.
# On CPU give each process its own devices with distributed.local_device_count.
set -euo pipefail
n=${1:?number of processes}; shift
mpirun --oversubscribe -n "$n" fli-mock run_dir=outputs/mock/mpi-$(date +%Y%m%d-%H%M%S) "$@"
