#!/usr/bin/env python
"""Summarise a sampling run brought back from the device machine (scripts/device/gpu_default_sample.sh).

    python -m scripts.device.summarise_device_run --run DIR/run --mock DIR/mock --log DIR/sample1.log --out FILE.json

Per chain: its step size, (Omega_c, sigma8) at each chunk's end, and how far its field moved and
fits the data, from the running field moments the pack brings back (the thinned fields stay on
the device): the mean per-cell variance of the white noise over the post-warm-up draws (1 for a
chain that has mixed), the correlation of its mean with the mock's white noise, and the chi^2 of
its mean convergence map against the observed one (about the number of pixels where it fits).
Speed: seconds per transition of all the vectorised chains and per gradient evaluation, from the
run's nuts.json, and the chunk program's compile time from the log.
"""

from __future__ import annotations

import argparse
import glob
import json
import re

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--mock", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import zarr

    from fli.store.io import load_observation

    nuts = json.load(open(f"{a.run}/nuts.json"))
    obs = load_observation(a.mock)
    s_true, kobs, sig = np.asarray(obs.white_noise), np.asarray(obs.kappa_obs), np.asarray(obs.noise_sigma)
    compiled = re.search(r"compiled the \d+-draw chunk program in ([\d.]+) s", open(a.log).read())
    out = {"dim": nuts["dim"], "draws": nuts["draws"], "warmup": nuts["num_warmup"],
           "gradient_evals": nuts["gradient_evals"], "seconds_sampling": nuts["seconds_sampling"],
           "seconds_per_transition_all_chains": nuts["seconds_sampling"] / nuts["draws"],
           "seconds_per_gradient_evaluation": nuts["seconds_sampling"] / nuts["gradient_evals"],
           "compile_seconds": float(compiled.group(1)) if compiled else None, "chains": {}}
    for c in sorted(glob.glob(f"{a.run}/chain_*")):
        name = c.rsplit("/", 1)[-1]
        ends = []
        for f in sorted(glob.glob(f"{c}/chunks/chunk_*/draws.npz")):
            d = np.load(f)
            ends.append([int(d["draw"][-1]), float(d["Omega_c"][-1]), float(d["sigma8"][-1])])
        g = zarr.open_group(f"{c}/running.zarr", mode="r")
        m, v, mk = (np.asarray(g[k]) for k in ("mean_white_noise", "var_white_noise", "mean_kappa"))
        res = (mk - kobs) / sig[:, None, None]
        out["chains"][name] = {
            "step_size": nuts["chains"][name]["step_size"], "omega_c_sigma8_at_chunk_ends": ends,
            "post_warmup_white_noise_variance_per_cell_mean": float(v.mean()),
            "corr_mean_white_noise_truth": float(np.sum(m * s_true) / np.sqrt(np.sum(m * m) * np.sum(s_true ** 2))),
            "chi2_of_mean_kappa": float(np.sum(res ** 2)), "map_pixels": int(res.size)}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    for name, ch in out["chains"].items():
        end = ch["omega_c_sigma8_at_chunk_ends"][-1][1:]
        print(f"{name}: step {ch['step_size']:.3g}; Omega_c, sigma8 at the end {end}; "
              f"var(s) per cell {ch['post_warmup_white_noise_variance_per_cell_mean']:.3f}; corr with truth "
              f"{ch['corr_mean_white_noise_truth']:.4f}; chi2 of the mean map {ch['chi2_of_mean_kappa']:.0f} "
              f"over {ch['map_pixels']} pixels")
    print(f"{out['seconds_per_transition_all_chains']:.3f} s a transition, "
          f"{out['seconds_per_gradient_evaluation']:.4f} s a gradient evaluation, compile {out['compile_seconds']} s")


if __name__ == "__main__":
    main()
