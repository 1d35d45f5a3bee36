"""Synthetic fli-nuts chains for fli-diagnose's tests (tests/infer/test_diagnose*.py), written in
fli-nuts's on-disk format (config.yaml, chunks/chunk_<i>/{draws,stats,spectra}.npz and DONE) by
:func:`write_chain`: iid Gaussian parameters, iid energies, tree depths below the maximum and no
divergences make a healthy chain; a test breaks one of these."""

import json

import numpy as np
import yaml

N_K = 6
VCELL = 2.0  # (Mpc/h)^3, the prior expectation of the white noise's P(k)


def small_config():
    """The small mock's resolved config (tests/helpers/posterior.py) with 10 warm-up draws."""
    from fli.cli.compose import compose
    from tests.helpers.posterior import SMALL

    _, resolved = compose([*SMALL, "inference.num_warmup=10"])
    return resolved


def healthy(n=1000, seed=0, warmup=10):
    """Arrays of one healthy chain of ``warmup + n`` draws (warm-up first)."""
    rng = np.random.default_rng(seed)
    m = warmup + n
    oc = 0.26 + 0.02 * rng.standard_normal(m)
    s8 = 0.80 + 0.03 * rng.standard_normal(m)
    om = oc + 0.049
    depth = rng.integers(2, 5, m)  # max_tree_depth of the config is 6
    n_steps = 2 ** depth - 1
    draws = {"draw": np.arange(m), "warmup": np.arange(m) < warmup, "Omega_c": oc, "sigma8": s8, "Omega_m": om,
             "S8": s8 * np.sqrt(om / 0.3)}
    stats = {"diverging": np.zeros(m, bool), "energy": 1000 + 20 * rng.standard_normal(m),
             "potential_energy": 1000 + 10 * rng.standard_normal(m), "tree_depth": depth, "n_steps": n_steps,
             "step_size": np.full(m, 0.1), "acceptance_rate": rng.uniform(0.6, 1.0, m),
             "mean_accept_prob": rng.uniform(0.6, 1.0, m), "turning": np.ones(m),  # every tree ended by a U-turn
             "gradient_evals": 1 + np.cumsum(n_steps),
             "seconds": 0.01 * np.arange(1, m + 1)}
    spectra = {"k": 0.02 * np.arange(1, N_K + 1), "pk_white_noise": VCELL * (1 + 0.1 * rng.standard_normal((m, N_K))),
               "pk_linear": 100 + rng.random((m, N_K))}
    return draws, stats, spectra


def write_chain(run, config, arrays, chunk=250, seed=None):
    """Write ``arrays`` (draws, stats, spectra) as fli-nuts chunks of ``chunk`` draws into ``run``."""
    draws, stats, spectra = arrays
    run.mkdir(parents=True)
    cfg = {**config, "run_dir": str(run), "seed": seed if seed is not None else config["seed"]}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    m = draws["draw"].size
    for i, a in enumerate(range(0, m, chunk)):
        d = run / "chunks" / f"chunk_{i:05d}"
        d.mkdir(parents=True)
        sl = slice(a, min(a + chunk, m))
        np.savez(d / "draws.npz", **{k: v[sl] for k, v in draws.items()})
        np.savez(d / "stats.npz", draw=draws["draw"][sl], **{k: v[sl] for k, v in stats.items()})
        np.savez(d / "spectra.npz", draw=draws["draw"][sl], k=spectra["k"],
                 **{k: v[sl] for k, v in spectra.items() if k != "k"})
        (d / "DONE").write_text(json.dumps({"chunk": i}))
    return run


def four(tmp_path, config, change=None, n=1000):
    """Four healthy chains, chain 0 passed through ``change`` first."""
    runs = []
    for j in range(4):
        a = healthy(n=n, seed=j)
        if j == 0 and change is not None:
            change(*a)
        runs.append(write_chain(tmp_path / f"c{j}", config, a, seed=j))
    return runs


def shifted(draws, stats, spectra):
    """The defect of chains that disagree: sigma8 (and S8 with it) moved by 3 posterior sds."""
    draws["sigma8"][:] += 0.09  # 3 posterior sd
    om = draws["Omega_m"]
    draws["S8"][:] = draws["sigma8"] * np.sqrt(om / 0.3)


def diagnose_main(args):
    """fli-diagnose's command on ``args`` (imported when a test runs it)."""
    from fli.cli.diagnose import main

    return main(args)
