"""Worker: continue a fli-nuts run from its checkpoint in a fresh process with the kernel's
``step`` alone (its ``init`` replaced by a function that raises), and compare the draws with the
run's own next chunk.

usage: python kernel_worker.py RUN_DIR MOCK CHECKPOINT CHUNK_LENGTH [overrides...]
prints ``max |draw difference| = <x>`` over the sampled parameters of chunk CHECKPOINT + 1.
"""

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main(run_dir: str, mock: str, step: str, n: str, *overrides: str) -> None:
    import logging
    from pathlib import Path

    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from fli.cli.compose import compose
    from fli.infer.checkpoint import store as ckpt
    from fli.infer.sample.chunk import Accum, make_chunk, zero_accum
    from fli.infer.posterior.layout import FLAT_SPEC
    from fli.infer.posterior.setup import prepare
    from fli.infer.sample.run_store import CHECKPOINTS, read_chunks
    from fli.infer.sample.run import kernel_of
    from fli.infer.sample.start import chain_keys
    from fli.sim.power import default_kedges

    if os.environ.get("FLI_COMPILATION_CACHE"):  # the tests' cache (tests/conftest.py): the run compiled this chunk
        jax.config.update("jax_compilation_cache_dir", os.environ["FLI_COMPILATION_CACHE"])
    cfg, _ = compose([*overrides, f"mock={mock}", f"run_dir={run_dir}"])
    obs, post, data = prepare(cfg, logging.getLogger("worker"), compare_truth=False)

    def no_init(*_):
        raise AssertionError("init was called")

    kernel = kernel_of(cfg, post)._replace(init=no_init)
    grid, lay = post.fwd.grid, post.layout
    _, keys = chain_keys(cfg.seed, 1)
    z0 = jax.ShapeDtypeStruct((1, lay.size), grid.jdtype, sharding=NamedSharding(grid.mesh, P(None, *FLAT_SPEC)))
    template = {"kernel": kernel.template(z0, keys, data), "acc": zero_accum(post, 1)}
    state, _ = ckpt.restore_checkpoint(Path(run_dir) / CHECKPOINTS, int(step), template)
    icfg = cfg.inference
    prog = make_chunk(kernel, post, int(n), icfg.field_thin, icfg.num_warmup, default_kedges(grid.fft, grid.box))
    _, _, draws, _ = prog(state["kernel"], Accum(*state["acc"]), data)
    saved = read_chunks(Path(run_dir), [int(step) + 1])["draws"]
    diff = max(float(np.max(np.abs(np.asarray(draws.params[k])[:, 0] - saved[k]))) for k in post.names)
    print(f"max |draw difference| = {diff!r}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
