"""Worker for test_checkpoint: a distributed save, or a save that hangs just before its commit.

usage:
  python ckpt_worker.py save PORT NPROC PID CKPT_DIR   one of NPROC processes (2 CPU devices
      each): save a (2, 2)-sharded field, a replicated scalar and a key as steps 1 and 2
      (keep=1), check latest_step and a restore on the (4, 1) layout in the same processes.
  python ckpt_worker.py hang CKPT_DIR   one process: save step 1, then save step 2 but stop
      inside orbax's commit (all data written, not yet renamed), printing COMMITTING, and wait
      there to be killed.
"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

SHAPE, SEED, SCALAR = (8, 8, 4), 11, 0.625


def reference_field():
    """The saved field's values, ``[8, 8, 4]`` float32, the same on every process."""
    import numpy as np  # noqa: PLC0415

    return np.random.default_rng(SEED).standard_normal(SHAPE, dtype=np.float32)


def state_on(mesh):
    """The state both sides of the test build on ``mesh``: the field ``P('x', 'y')`` and a
    replicated scalar (each process filling its own blocks: nothing to compile), a key, an int."""
    import numpy as np  # noqa: PLC0415

    from fli.sim.sharding import field_sharding, replicated  # noqa: PLC0415

    field, scalar = reference_field(), np.float32(SCALAR)
    return {"field": jax.make_array_from_callback(SHAPE, field_sharding(mesh), lambda i: field[i]),
            "scalar": jax.make_array_from_callback((), replicated(mesh), lambda i: scalar),
            "key": jax.random.key(5), "count": 7}


def main() -> None:
    mode = sys.argv[1]
    jax.config.update("jax_num_cpu_devices", 2)
    if mode == "save":
        port, nproc, pid, ckpt = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)
    else:
        pid, ckpt = 0, sys.argv[2]

    import numpy as np  # noqa: PLC0415

    from fli.infer.checkpoint.store import latest_step, restore_checkpoint, save_checkpoint  # noqa: PLC0415
    from fli.sim.sharding import make_mesh  # noqa: PLC0415

    mesh = make_mesh((2, 2) if mode == "save" else (1, 2))
    state = state_on(mesh)
    save_checkpoint(ckpt, 1, state, {"pdims": [2, 2], "pid_saving": pid}, keep=1)
    if mode == "hang":
        from orbax.checkpoint._src.path import atomicity  # noqa: PLC0415

        async def hang(*_, **__):
            import time  # noqa: PLC0415

            print("COMMITTING", flush=True)
            time.sleep(600)

        atomicity.on_commit_callback = hang
        save_checkpoint(ckpt, 2, state, {"pdims": [1, 2]})
        raise SystemExit("the commit was not intercepted")

    save_checkpoint(ckpt, 2, state, {"pdims": [2, 2], "pid_saving": pid}, keep=1)
    step = latest_step(ckpt)
    assert step == 2, step
    other = make_mesh((4, 1))
    restored, meta = restore_checkpoint(ckpt, None, state_on(other))
    ref = reference_field()
    assert restored["field"].sharding.mesh.shape == other.shape
    for shard in restored["field"].addressable_shards:  # each process checks its own blocks
        assert np.array_equal(np.asarray(shard.data), ref[shard.index]), shard.index
    assert float(restored["scalar"].addressable_shards[0].data) == SCALAR and restored["count"] == 7
    assert np.array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(state["key"]))
    assert meta["pid_saving"] == 0, meta  # the JSON is written by process 0 only
    print(f"process {pid}: {jax.process_count()} processes, {jax.device_count()} devices, "
          f"latest {step}, restored on (4, 1), ok", flush=True)


if __name__ == "__main__":
    main()
