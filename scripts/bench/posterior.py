#!/usr/bin/env python
"""Benchmark the posterior's value and gradient against the PM gradient alone, side by side.

For each experiment (a Hydra config, composed as the console scripts do) one worker process
compiles every variant below, then times them in interleaved rounds (each round runs every
variant once, in an order rotated from round to round) and reports, per variant, the median
time and the median over rounds of its time over the PM gradient's in the same round. On a
shared machine only these ratios are meaningful: absolute times move with the other jobs.

    python -m scripts.bench.posterior --experiments default,tiny --adjoint checkpoint,reversible \\
        --repeats 5 --json docs/bench/posterior_grad.json

Variants (each is a value and gradient w.r.t. the standardised cosmological latents theta and
the white noise s; ``*`` = one per adjoint):

  pm*             2LPT + FastPM at the fiducial (host numpy) step times, no hook; loss
                  sum(w rho^2) of the final density: the PM gradient alone;
  pm_planes*      the same with the lens-plane hook; loss sum(w * planes);
  traced_planes*  as pm_planes with the step times a traced function of theta
                  (ForwardModel.a_steps): the posterior without the Born step and likelihood;
  posterior*      Posterior.value_and_grad() at (theta, s) on a mock's data (traced light cone);
  posterior_fiducial*  the same with lensing.lightcone=fiducial;
  posterior_linear     the same with simulation.forward=linear (no particles);
  posterior_tsc        the same with simulation.assignment=tsc (27-point mass assignment; first adjoint);
  lensing         Born convergence (traced plane times) + Gaussian likelihood of fixed planes,
                  gradient w.r.t. theta and the planes;
  cosmo_traced    scalars only: the step coefficients at the traced step times and the Born
                  weights, gradient w.r.t. theta;
  cosmo_fixed     scalars only: the step coefficients at the host step times.

Memory: XLA's buffers of the compiled executable (arguments + outputs + temporaries, per
device), and the process's peak RSS during one call: the allocator's freed heap is returned
to the OS (fli.sim.host.release_freed_memory) and the kernel's peak-RSS mark reset
(/proc/self/clear_refs) before the call, then read back (VmHWM, and ru_maxrss) after it.
``transient`` is that peak minus the RSS just before the call. Compilation peaks are read the
same way around each compile.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

EXPERIMENTS = {"default": [], "tiny": ["experiment=tiny"]}
PER_ADJOINT = ("pm", "pm_planes", "traced_planes", "posterior", "posterior_fiducial")
SHARED = ("posterior_linear", "posterior_tsc", "lensing", "cosmo_traced", "cosmo_fixed")
ALL_VARIANTS = PER_ADJOINT + SHARED


# ---------------------------------------------------------------------------- process memory

def _status_mb(key: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux >= 4.0); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _maxrss_mb() -> float:
    import resource  # noqa: PLC0415

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class PeakRSS:
    """Context: trim the heap, reset the peak mark, then record RSS before and peak after."""

    def __enter__(self):
        from fli.sim.host import release_freed_memory  # noqa: PLC0415

        release_freed_memory()
        self.reset = _reset_peak()
        self.before = _status_mb("VmRSS")
        return self

    def __exit__(self, *exc):
        self.peak = _status_mb("VmHWM") if self.reset else None
        self.maxrss = _maxrss_mb()
        return False


# ---------------------------------------------------------------------------- worker

def worker(job: dict) -> dict:
    """Build, compile and time every variant of one experiment (devices set by the parent)."""
    import dataclasses  # noqa: PLC0415
    from types import SimpleNamespace  # noqa: PLC0415

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.sharding import NamedSharding  # noqa: PLC0415

    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.forward import fiducial_cosmology  # noqa: PLC0415
    from fli.sim.host import release_freed_memory  # noqa: PLC0415
    from fli.infer.posterior.model import Latents, build_posterior, make_data  # noqa: PLC0415
    from fli.lensing.born import KAPPA_SPEC, born_convergence, born_weights, plane_hook  # noqa: PLC0415
    from fli.mock import add_shape_noise  # noqa: PLC0415
    from fli.sim.nbody import density, simulate, step_coefficients  # noqa: PLC0415
    from fli.sim.sharding import white_noise  # noqa: PLC0415
    from fli.lensing.survey import noise_sigma  # noqa: PLC0415

    base_rss = _status_mb("VmRSS")
    cfg, _ = compose(job["overrides"])
    posts = {adj: build_posterior(compose(job["overrides"] + [f"simulation.adjoint={adj}"])[0])
             for adj in job["adjoints"]}
    post0 = posts[job["adjoints"][0]]
    fwd0 = post0.fwd
    grid, geom = fwd0.grid, fwd0.geometry
    mesh, dt = grid.mesh, grid.jdtype
    a_host = np.asarray(geom.a_steps(fwd0.a_start))  # fiducial crossings, host numpy
    fid = fiducial_cosmology(cfg)

    # the latents at the truth (the config's cosmology) and the mock's data
    theta = jax.device_put(jnp.asarray(post0.theta_of({n: float(getattr(fid, n)) for n in post0.names}), dt),
                           NamedSharding(mesh, jax.sharding.PartitionSpec()))
    s = white_noise(cfg.seed, grid.shape, mesh, dtype=dt)
    kappa, aux = jax.jit(fwd0)(jax.tree.map(lambda v: jnp.asarray(v, dt), fid), s)
    max_disp = float(np.max(np.asarray(aux.max_disp)))
    if max_disp >= grid.halo:
        raise RuntimeError(f"particles moved {max_disp:.2f} cells at the truth, more than simulation.halo = "
                           f"{grid.halo}: the run is invalid")
    sigma = noise_sigma(cfg.survey, cfg.lensing.fov_deg, cfg.lensing.npix)
    noisy = add_shape_noise(cfg.seed, kappa, sigma, None)  # fli-mock's shape noise
    data = make_data(SimpleNamespace(kappa_obs=noisy.kappa, noise_sigma=np.asarray(noisy.sigma), mask=None), fwd0)
    lat = Latents(theta, s)

    rng = np.random.default_rng(1)
    map_sh = NamedSharding(mesh, KAPPA_SPEC)

    def placed(host):
        host = np.asarray(host, grid.dtype)
        return jax.make_array_from_callback(host.shape, map_sh, lambda idx: host[idx])

    w_rho = white_noise(1, grid.shape, mesh, dtype=dt)
    plane_shape = (geom.n_used, *grid.shape[:2])
    w_planes = placed(rng.standard_normal(plane_shape))
    planes_in = placed(10.0 * rng.standard_normal(plane_shape))  # [Mpc/h], the size of real slabs
    hook = plane_hook(geom, grid)

    def cosmo_of(th):
        return post0.cosmology(th)

    # -- variants: name -> (jitted fn, args); each returns (value[, aux]) and the gradients
    def pm_fns(post):
        fwd = post.fwd

        def pm(th, s, w):
            st, _, _ = simulate(cosmo_of(th), s, grid, a_host, lpt_order=fwd.lpt_order, hook=None,
                                adjoint=fwd.adjoint)
            rho = density(st.disp, grid)
            return jnp.sum(w * rho * rho)

        def pm_planes(th, s, w):
            _, planes, _ = simulate(cosmo_of(th), s, grid, a_host, lpt_order=fwd.lpt_order, hook=hook,
                                    adjoint=fwd.adjoint)
            return jnp.sum(w * planes)

        def traced_planes(th, s, w):
            c = jax.tree.map(lambda v: jnp.asarray(v, dt), cosmo_of(th))
            _, planes, _ = simulate(c, s, grid, fwd.a_steps(c), lpt_order=fwd.lpt_order, hook=hook,
                                    adjoint=fwd.adjoint)
            return jnp.sum(w * planes)

        vg = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1)))
        fid_post = dataclasses.replace(post, fwd=dataclasses.replace(fwd, lightcone="fiducial"))
        return {
            "pm": (vg(pm), (theta, s, w_rho)),
            "pm_planes": (vg(pm_planes), (theta, s, w_planes)),
            "traced_planes": (vg(traced_planes), (theta, s, w_planes)),
            "posterior": (post.value_and_grad(), (lat, data)),
            "posterior_fiducial": (fid_post.value_and_grad(), (lat, data)),
        }

    def lensing(th, planes, data):
        c = jax.tree.map(lambda v: jnp.asarray(v, dt), cosmo_of(th))
        k = born_convergence(c, planes, geom, grid, fwd0.bins, plane_a=fwd0.plane_a(c))
        r = (k - data.kappa_obs) * data.weight
        return 0.5 * jnp.sum(r * r)

    def cosmo_traced(th):
        c = jax.tree.map(lambda v: jnp.asarray(v, dt), cosmo_of(th))
        co = step_coefficients(c, fwd0.a_steps(c))
        w = born_weights(c, geom, fwd0.bins, plane_a=fwd0.plane_a(c))
        return sum(jnp.sum(x) for x in co) + jnp.sum(w)

    def cosmo_fixed(th):
        c = jax.tree.map(lambda v: jnp.asarray(v, dt), cosmo_of(th))
        return sum(jnp.sum(x) for x in step_coefficients(c, jnp.asarray(a_host, dt)))

    lin_post = dataclasses.replace(post0, fwd=dataclasses.replace(fwd0, kind="linear"))
    variants = {}
    for adj, post in posts.items():
        for name, v in pm_fns(post).items():
            variants[f"{name}[{adj}]"] = v
    variants["posterior_linear"] = (lin_post.value_and_grad(), (lat, data))
    if "posterior_tsc" in job["variants"]:
        tsc_post = build_posterior(compose(job["overrides"] + [f"simulation.adjoint={job['adjoints'][0]}",
                                                               "simulation.assignment=tsc"])[0])
        variants["posterior_tsc"] = (tsc_post.value_and_grad(), (lat, data))
    variants["lensing"] = (jax.jit(jax.value_and_grad(lensing, argnums=(0, 1))), (theta, planes_in, data))
    variants["cosmo_traced"] = (jax.jit(jax.value_and_grad(cosmo_traced)), (theta,))
    variants["cosmo_fixed"] = (jax.jit(jax.value_and_grad(cosmo_fixed)), (theta,))
    want = set(job["variants"])
    variants = {k: v for k, v in variants.items() if k.split("[")[0] in want}

    # -- compile each apart from its runs; check one run
    res = {}
    compiled = {}
    for name, (fn, args) in variants.items():
        with PeakRSS() as m:
            t0 = time.perf_counter()
            lowered = fn.lower(*args)
            t1 = time.perf_counter()
            exe = lowered.compile()
            t2 = time.perf_counter()
        release_freed_memory()  # what the compiler freed goes back to the OS
        ma = exe.memory_analysis()
        mb = lambda b: b / 2**20
        res[name] = {
            "trace_lower_s": t1 - t0, "compile_s": t2 - t1,
            "xla_argument_mb": mb(ma.argument_size_in_bytes) if ma else None,
            "xla_output_mb": mb(ma.output_size_in_bytes) if ma else None,
            "xla_temp_mb": mb(ma.temp_size_in_bytes) if ma else None,
            "xla_alias_mb": mb(ma.alias_size_in_bytes) if ma else None,
            "xla_total_mb": mb(ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes)
            if ma else None,
            "compile_peak_rss_mb": m.peak, "compile_rss_before_mb": m.before,
            "times_s": [], "run_peak_rss_mb": [], "run_maxrss_mb": [], "rss_before_mb": [],
        }
        out = jax.block_until_ready(exe(*args))  # warm-up run, and the check
        val, grads = out
        extra = {}
        if isinstance(val, tuple):  # the posterior's (U, aux)
            val, extra = val
        leaves = [np.asarray(x) for x in jax.tree.leaves(grads)]
        if not (np.isfinite(float(val)) and all(np.all(np.isfinite(g)) for g in leaves)):
            raise RuntimeError(f"{name}: non-finite value or gradient")
        if "max_disp" in extra:
            md = float(extra["max_disp"])
            res[name]["max_disp_cells"] = md
            if md >= grid.halo:
                raise RuntimeError(f"{name}: particles moved {md:.2f} cells >= halo {grid.halo}")
        res[name]["grad_theta"] = [float(g) for g in np.asarray(jax.tree.leaves(grads)[0]).ravel()]
        compiled[name] = (exe, args)
        print(f"compiled {name}: {t2 - t1:.1f} s (+{t1 - t0:.1f} s trace)", file=sys.stderr, flush=True)

    # -- interleaved rounds
    names = list(compiled)
    for r in range(job["repeats"]):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            exe, args = compiled[name]
            with PeakRSS() as m:
                t0 = time.perf_counter()
                jax.block_until_ready(exe(*args))
                t = time.perf_counter() - t0
            res[name]["times_s"].append(t)
            res[name]["run_peak_rss_mb"].append(m.peak)
            res[name]["rss_before_mb"].append(m.before)
            res[name]["run_maxrss_mb"].append(m.maxrss)
        print(f"round {r + 1}/{job['repeats']} done", file=sys.stderr, flush=True)

    for d in res.values():
        d["run_s"] = float(np.median(d["times_s"]))
        if all(p is not None for p in d["run_peak_rss_mb"]):
            d["run_peak_rss_mb_max"] = float(np.max(d["run_peak_rss_mb"]))
            d["transient_rss_mb"] = float(np.median(np.subtract(d["run_peak_rss_mb"], d["rss_before_mb"])))
    # ratios to the PM gradient of the same adjoint (the same round, then the median)
    for name, d in res.items():
        adj = name.split("[")[1][:-1] if "[" in name else job["adjoints"][0]
        ref = f"pm[{adj}]"
        if ref not in res:
            continue
        d["ratio_to"] = ref
        d["time_ratio"] = float(np.median(np.divide(d["times_s"], res[ref]["times_s"])))
        for key in ("xla_total_mb", "transient_rss_mb", "run_peak_rss_mb_max"):
            if d.get(key) is not None and res[ref].get(key):
                d[key.replace("_mb", "") + "_ratio"] = d[key] / res[ref][key]
    # each starred variant against itself under the first adjoint named (the same round, then
    # the median): what changing simulation.adjoint does to that computation
    first = job["adjoints"][0]
    for name, d in res.items():
        if "[" not in name or name.endswith(f"[{first}]"):
            continue
        ref = name.split("[")[0] + f"[{first}]"
        if ref not in res:
            continue
        d["adjoint_ratio_to"] = ref
        d["adjoint_time_ratio"] = float(np.median(np.divide(d["times_s"], res[ref]["times_s"])))
        d["adjoint_time_ratio_quartiles"] = [float(q) for q in
                                             np.percentile(np.divide(d["times_s"], res[ref]["times_s"]), [25, 75])]
        for key in ("xla_total_mb", "transient_rss_mb"):
            if d.get(key) is not None and res[ref].get(key):
                d["adjoint_" + key.replace("_mb", "") + "_ratio"] = d[key] / res[ref][key]
    return {
        "experiment": job["name"], "overrides": job["overrides"], "pdims": list(grid.pdims),
        "devices": jax.device_count(), "platform": jax.devices()[0].platform, "jax": jax.__version__,
        "mesh": list(grid.shape), "box": list(grid.box), "n_steps": int(len(a_host) - 1), "halo": grid.halo,
        "npix": geom.npix, "n_bins": fwd0.n_bins, "sampled": list(post0.names), "dtype": grid.dtype,
        "max_disp_truth_cells": max_disp, "repeats": job["repeats"], "baseline_rss_mb": base_rss,
        "process_maxrss_mb": _maxrss_mb(), "peak_reset": _reset_peak(), "variants": res,
    }


# ---------------------------------------------------------------------------- driver

def _source() -> dict:
    """Which code was measured: the fli package's path, and the git commit and the modified
    tracked files of fli/ and conf/ where the checkout is a git repository."""
    import fli  # noqa: PLC0415

    root = os.path.dirname(os.path.dirname(os.path.abspath(fli.__file__)))
    out = {"fli": os.path.dirname(os.path.abspath(fli.__file__))}
    try:
        git = lambda *a: subprocess.run(["git", "-C", root, *a], capture_output=True, text=True,
                                        check=True).stdout.strip()
        out["commit"] = git("rev-parse", "HEAD")
        status = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "fli", "conf"], capture_output=True,
                                text=True, check=True).stdout  # not stripped: each line's first column is its status
        out["modified"] = [ln[3:] for ln in status.splitlines()]
    except (OSError, subprocess.CalledProcessError):
        pass
    return out


def _fmt(v, f):
    return "-" if v is None else format(v, f)


def print_table(r: dict) -> None:
    print(f"\n{r['experiment']}: mesh {'x'.join(map(str, r['mesh']))}, {r['n_steps']} steps, pdims "
          f"{'x'.join(map(str, r['pdims']))}, {r['repeats']} interleaved rounds")
    print(f"{'variant':>34} {'compile_s':>9} {'run_s':>7} {'t/pm':>6} {'XLA_MB':>8} {'x/pm':>5} "
          f"{'peak_MB':>8} {'trans_MB':>8} {'tr/pm':>6}")
    for name, d in r["variants"].items():
        print(f"{name:>34} {d['compile_s']:9.1f} {d['run_s']:7.3f} {_fmt(d.get('time_ratio'), '6.2f')} "
              f"{_fmt(d['xla_total_mb'], '8.0f')} {_fmt(d.get('xla_total_ratio'), '5.2f')} "
              f"{_fmt(d.get('run_peak_rss_mb_max'), '8.0f')} {_fmt(d.get('transient_rss_mb'), '8.0f')} "
              f"{_fmt(d.get('transient_rss_ratio'), '6.2f')}", flush=True)
    for name, d in r["variants"].items():
        if "adjoint_ratio_to" in d:
            q = d["adjoint_time_ratio_quartiles"]
            print(f"{name:>34} over {d['adjoint_ratio_to']}: time {d['adjoint_time_ratio']:.2f} [{q[0]:.2f}, "
                  f"{q[1]:.2f}], XLA buffers {_fmt(d.get('adjoint_xla_total_ratio'), '.2f')}, transient RSS "
                  f"{_fmt(d.get('adjoint_transient_rss_ratio'), '.2f')}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiments", default="default,tiny",
                    help=f"comma-separated, from {sorted(EXPERIMENTS)} (default: both): 'default' is the composed "
                         "conf/ as it is, 'tiny' adds experiment=tiny; each runs in its own worker process")
    ap.add_argument("--adjoint", default="checkpoint,reversible",
                    help="PM adjoints (simulation.adjoint), comma-separated; each gets its own starred variants, "
                         "all in the same process (default: both)")
    ap.add_argument("--pdims", default="1x2", help="PXxPY device mesh (distributed.pdims); as many CPU devices "
                    "are made with XLA_FLAGS")
    ap.add_argument("--variants", default=",".join(ALL_VARIANTS),
                    help="comma-separated subset of the variants listed below (default: all; pm is needed for the "
                         "ratios)")
    ap.add_argument("--override", action="append", default=[],
                    help="extra Hydra override for every experiment, e.g. --override seed=3 (repeatable)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="interleaved rounds after the warm-up run (medians over them; default 5)")
    ap.add_argument("--json", default=None, help="write the results to this file")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0

    px, py = (int(v) for v in args.pdims.lower().split("x"))
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in ALL_VARIANTS]
    if bad:
        ap.error(f"unknown variant {bad[0]!r}; valid: {', '.join(ALL_VARIANTS)}")
    adjoints = [a for a in args.adjoint.split(",") if a]
    if any(a not in ("checkpoint", "reversible") for a in adjoints):
        ap.error(f"--adjoint takes checkpoint and/or reversible, got {args.adjoint!r}")
    results = []
    for name in args.experiments.split(","):
        if name not in EXPERIMENTS:
            ap.error(f"unknown experiment {name!r}; valid: {', '.join(EXPERIMENTS)}")
        job = {"name": name, "overrides": EXPERIMENTS[name] + [f"distributed.pdims=[{px},{py}]"] + args.override,
               "adjoints": adjoints, "variants": variants, "repeats": args.repeats}
        env = dict(os.environ)
        if env.get("JAX_PLATFORMS", "cpu") == "cpu" and "CUDA_VISIBLE_DEVICES" not in env:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={px * py}").strip()
        t0 = time.perf_counter()
        # the worker's progress (stderr) passes through; its result comes back on stdout
        proc = subprocess.run([sys.executable, "-m", __spec__.name, "--worker", json.dumps(job)], env=env,
                              stdout=subprocess.PIPE, text=True)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            print(f"experiment {name} failed (exit status {proc.returncode}; its stderr is above)", file=sys.stderr)
            return 1
        r = json.loads(line[len("RESULT "):])
        r["wall_s"] = time.perf_counter() - t0
        r["source"] = _source()
        r["command"] = " ".join(["python", "scripts/bench/posterior.py", *(sys.argv[1:] if argv is None else argv)])
        results.append(r)
        print_table(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
