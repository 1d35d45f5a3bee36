#!/usr/bin/env python
"""The posterior's value and gradient under several configs, timed side by side in one process.

Each ``--config NAME=OVERRIDES`` (space-separated Hydra overrides) builds its posterior on its own
forward's kappa at the fiducial cosmology plus shape noise, and compiles its value and gradient
once. Then every round calls each config once, in an order rotated from round to round, and the
report gives each config's median time and the median over rounds of its time over the first
config's in the same round: on a shared machine only such ratios are meaningful.

    python -m scripts.bench.cost_side_by_side --repeats 5 --json docs/bench/cost_fine.json \\
        --config "default=" --config "fine=experiment=fine"
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", required=True, metavar="NAME=OVERRIDES")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.infer.posterior.model import Latents, build_posterior, make_data  # noqa: PLC0415
    from fli.sim.sharding import make_mesh, white_noise  # noqa: PLC0415
    from fli.lensing.survey import noise_sigma  # noqa: PLC0415

    calls, out = {}, {"configs": {}, "repeats": a.repeats}
    for spec in a.config:
        name, _, over = spec.partition("=")
        cfg, _ = compose(over.split())
        post = build_posterior(cfg, mesh=make_mesh(cfg.distributed.pdims))
        g = post.fwd.grid
        lat = Latents(jnp.zeros((post.prior.n,), g.jdtype), white_noise(0, g.shape, g.mesh, dtype=g.jdtype))
        kappa = np.asarray(jax.device_get(jax.jit(lambda x: post.predict(x)[0])(lat)))
        sigma = noise_sigma(cfg.survey, cfg.lensing.fov_deg, cfg.lensing.npix)
        noisy = kappa + np.random.default_rng(1).normal(size=kappa.shape) * np.asarray(sigma)[:, None, None]
        data = make_data(SimpleNamespace(kappa_obs=noisy, noise_sigma=sigma, mask=None), post.fwd, post.ell_max)
        vg = post.value_and_grad()
        t0 = time.perf_counter()
        jax.block_until_ready(vg(lat, data))
        calls[name] = lambda vg=vg, lat=lat, data=data: jax.block_until_ready(vg(lat, data))
        out["configs"][name] = {"overrides": over.split(), "mesh": list(g.shape), "compile_and_first_s":
                                time.perf_counter() - t0}
        print(f"{name}: {g.shape} cells, compiled and ran once in {out['configs'][name]['compile_and_first_s']:.1f} s",
              flush=True)
    names = list(calls)
    times = {n: [] for n in names}
    for r in range(a.repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            t0 = time.perf_counter()
            calls[n]()
            times[n].append(time.perf_counter() - t0)
    for n in names:
        ratio = statistics.median(t / t0 for t, t0 in zip(times[n], times[names[0]], strict=True))
        out["configs"][n].update(median_s=statistics.median(times[n]), times_s=times[n], over_first=ratio)
        print(f"{n}: median {statistics.median(times[n]):.2f} s, {ratio:.2f}x {names[0]}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
