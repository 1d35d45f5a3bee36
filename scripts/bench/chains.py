#!/usr/bin/env python
"""Vectorised chains (``inference.chains_per_run``) against one chain, side by side.

Times fli-nuts's own chunk program (the one ``fli-nuts`` compiles: transition, prediction,
running statistics, spectra) for C = 1, 2, 4 chains on a mock, with the HMC kernel at a fixed
number of leapfrog steps, so that every chain does the same work per draw whatever C is. The
programs are compiled first, then timed in interleaved rounds (each round runs every C once, in
an order rotated from round to round). Reported per C: the median seconds per chunk and the
median over rounds of ``t(C) / (C t(1))``, the time per chain-draw against one chain's in the
same round. Below 1, vectorising pays; NUTS adds the cost of waiting for the deepest tree
(``--nuts-stats`` estimates it from independent chains' tree sizes).

    python -m scripts.bench.chains --mock /tmp/nuts/mock --overrides experiment=tiny \\
        --chains 1,2,4 --draws 4 --steps 8 --rounds 3 --json docs/bench/chains.json
    python -m scripts.bench.chains --nuts-stats /tmp/hour/chain0,/tmp/hour/chain1,...

``--nuts-stats``: for runs of independent NUTS chains, the fraction of a vectorised draw's
leapfrog steps that are useful, mean over draws of ``sum_c n_c / (C max_c n_c)``, after warm-up.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path



def nuts_stats(runs: list[str]) -> dict:
    import numpy as np  # noqa: PLC0415

    from fli.infer.sample.run_store import read_chunks  # noqa: PLC0415

    chains = [read_chunks(r) for r in runs]
    n = min(c["stats"]["n_steps"].size for c in chains)
    steps = np.stack([c["stats"]["n_steps"][:n] for c in chains])
    post = ~np.asarray(chains[0]["draws"]["warmup"][:n], bool)
    useful = steps.sum(0) / (len(runs) * steps.max(0))
    return {"runs": runs, "draws": int(post.sum()), "useful_fraction_post_warmup": float(useful[post].mean()),
            "useful_fraction_warmup": float(useful[~post].mean()) if (~post).any() else None}


def timing(mock: str, overrides: list[str], chains: list[int], draws: int, steps: int, rounds: int) -> dict:
    import jax  # noqa: PLC0415

    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.infer.sample.chunk import make_chunk, zero_accum  # noqa: PLC0415
    from fli.infer.posterior.setup import prepare  # noqa: PLC0415
    from fli.infer.sample.run import kernel_of  # noqa: PLC0415
    from fli.infer.sample.start import chain_keys, initial_point  # noqa: PLC0415
    from fli.sim.power import default_kedges  # noqa: PLC0415

    log = logging.getLogger("bench")
    over = [*overrides, f"mock={mock}", "inference.kernel=hmc", f"inference.num_steps={steps}",
            "inference.step_size=0.02", "inference.num_warmup=0", f"inference.chunk={draws}",
            f"inference.field_thin={draws}"]
    cfg, _ = compose(over)
    obs, post, data = prepare(cfg, log, compare_truth=False)
    kernel = kernel_of(cfg, post)
    kedges = default_kedges(post.fwd.grid.fft, post.fwd.grid.box)
    progs, states = {}, {}
    for c in chains:
        k_inits, k_kernels = chain_keys(0, c)
        z0 = jax.numpy.stack([initial_point(cfg, post, obs, k, log)[0] for k in k_inits])
        kstate, acc = kernel.init(z0, k_kernels, data), zero_accum(post, c)
        t = time.perf_counter()
        progs[c] = make_chunk(kernel, post, draws, draws, 0, kedges).lower(kstate, acc, data).compile()
        print(f"compiled C={c} in {time.perf_counter() - t:.1f} s", flush=True)
        states[c] = (kstate, acc)
    times = {c: [] for c in chains}
    for r in range(rounds + 1):  # round 0 warms the caches and is not counted
        order = chains[r % len(chains):] + chains[:r % len(chains)]
        for c in order:
            kstate, acc = states[c]
            t = time.perf_counter()
            kstate, acc, out, _ = progs[c](kstate, acc, data)
            jax.block_until_ready(kstate)
            dt = time.perf_counter() - t
            states[c] = (kstate, acc)
            if r:
                times[c].append(dt)
        print(f"round {r}: " + ", ".join(f"C={c} {times[c][-1] if r else 0:.2f} s" for c in chains), flush=True)
    base = chains[0]
    return {"mock": mock, "overrides": overrides, "draws_per_chunk": draws, "leapfrog_steps": steps,
            "rounds": rounds, "devices": jax.device_count(),
            "per_chains": {str(c): {"median_s_per_chunk": statistics.median(times[c]),
                                    "median_ratio_per_chain_draw": statistics.median(
                                        [t / (c / base * tb) for t, tb in zip(times[c], times[base], strict=True)])}
                           for c in chains}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mock", help="a fli-mock run directory")
    ap.add_argument("--overrides", default="experiment=tiny", help="comma-separated config overrides")
    ap.add_argument("--chains", default="1,2,4")
    ap.add_argument("--draws", type=int, default=4, help="draws per timed chunk")
    ap.add_argument("--steps", type=int, default=8, help="HMC leapfrog steps per draw")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nuts-stats", default=None, help="comma-separated fli-nuts run dirs of independent chains")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    out = {}
    if a.nuts_stats:
        out["nuts_stats"] = nuts_stats(a.nuts_stats.split(","))
    if a.mock:
        out["timing"] = timing(a.mock, [o for o in a.overrides.split(",") if o], [int(c) for c in a.chains.split(",")],
                               a.draws, a.steps, a.rounds)
    if not out:
        ap.error("give --mock (timing) and/or --nuts-stats")
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
