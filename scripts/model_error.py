#!/usr/bin/env python
"""What the model's missing small scales do to S8: paired mocks, analysed with and without the scale cut.

Issue 22, part 4. For pair ``i`` two observations share their initial conditions and their shape
noise:

* **model**: the analysis config's own forward on the white noise of ``seed=i``;
* **finer**: the same config with ``--finer`` overrides (for example 2x the mesh, more planes,
  particle planes with the shift) on that white noise refined onto its grid
  (:func:`fli.refine.refine_white_noise`: the coarse grid's modes kept, finer ones fresh).

Both carry the same noise map (``fli.mock.add_shape_noise(i, ...)``; same key, same pixels), so
their difference is the two forwards' difference alone. Each is written as an observation
(``observation.zarr``, no white noise: the analysis sees data only) and analysed by ``fli-map
inference.map.estimator=muse`` with the analysis config, once reading every pixel and once with
``lensing.ell_max`` (``--ell-max``). The shift of S8 between the pair, over the model mock's MUSE
sd, is reported for each; issue 22's goal is under 0.5 with the cut. The model mock's all-pixel
analysis starts from the prior's median, the other three from its estimate.

Each command runs niced on one core (``--core``); two drivers share a study by claiming pairs.
Resumable: finished steps are passed over, and ``--keep DIR`` copies each finished analysis's
map.json to ``DIR/pair_<i>_<mock>_<cut>.json`` (committed), which count as finished. ``--mocks-only``
makes the observations and stops.

    nice -n 19 python scripts/model_error.py --out /tmp/me --pairs 4 --ell-max 300,600 \\
        --keep docs/bench/model_error_tiny \\
        --finer "simulation.mesh=[32,32,128] simulation.halo=6 lensing.n_planes=16" -- \\
        experiment=tiny survey.sigma_e=0.05 inference.map.muse.n_sims=16 inference.map.muse.map_steps=300
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from study import claim, emit, keep_record, run_logged  # noqa: E402

MOCKS = ("model", "finer")
REFINE_SEED = 1_000_000  # the finer grid's fresh modes of pair i: numpy seed REFINE_SEED + i


def make_pair(out: Path, i: int, overrides: list[str], finer: list[str]) -> dict:
    """Write ``out/pair_<i>/{model,finer}/observation.zarr`` and ``noiseless.npz`` (the two
    noiseless maps); returns what was made. One process, the default device mesh."""
    import jax  # noqa: PLC0415

    from fli.cli.common import compose  # noqa: PLC0415
    from fli.config import ConfigError  # noqa: PLC0415
    from fli.forward import build_forward, fiducial_cosmology  # noqa: PLC0415
    from fli.io import write_observation  # noqa: PLC0415
    from fli.mock import add_shape_noise  # noqa: PLC0415
    from fli.painting import check_halo  # noqa: PLC0415
    from fli.refine import refine_white_noise  # noqa: PLC0415
    from fli.sharding import make_mesh, white_noise  # noqa: PLC0415
    from fli.survey import load_mask, noise_sigma  # noqa: PLC0415

    pair = out / f"pair_{i:03d}"
    cfgs = {m: compose([*overrides, *(finer if m == "finer" else []), f"seed={i}"]) for m in MOCKS}
    s_model = None
    made = {}
    for m in MOCKS:
        cfg, resolved = cfgs[m]
        fwd = build_forward(cfg, mesh=make_mesh(cfg.distributed.pdims))
        grid = fwd.grid
        if m == "model":
            s = white_noise(i, grid.shape, grid.mesh, dtype=grid.jdtype)
            s_model = np.asarray(jax.device_get(s), np.float64)
        else:
            host = refine_white_noise(s_model, grid.shape, np.random.default_rng(REFINE_SEED + i)).astype(grid.dtype)
            s = jax.make_array_from_callback(host.shape, grid.sharding, lambda idx, h=host: h[idx])
        kappa, aux = jax.jit(lambda c, x, f=fwd: f(c, x))(fiducial_cosmology(cfg), s)
        max_disp = float(np.max(np.asarray(aux.max_disp)))
        try:
            check_halo(max_disp, grid.halo, "raise")
        except ValueError as e:
            raise ConfigError(f"{m} mock of pair {i}: simulation.halo: {e}") from None
        sigma = noise_sigma(cfg.survey, cfg.lensing.fov_deg, cfg.lensing.npix)
        mask = load_mask(cfg.survey, cfg.lensing.npix)
        noisy = add_shape_noise(i, kappa, sigma, mask)
        path = pair / m / "observation.zarr"
        shutil.rmtree(path.parent, ignore_errors=True)
        write_observation(path, np.asarray(noisy.kappa), sigma, np.stack([np.asarray(b.z) for b in fwd.bins]),
                          np.stack([np.asarray(b.nz) for b in fwd.bins]), cfg.lensing.fov_deg, mask,
                          attrs={"truth": cfg.cosmology.parameters(), "made_by": f"scripts/model_error.py {m}",
                                 "config": resolved, "seed": i})
        made[m] = {"kappa_true": np.asarray(kappa), "mesh": list(grid.shape), "max_disp": max_disp}
    np.savez(pair / "noiseless.npz", **{m: made[m]["kappa_true"] for m in MOCKS})
    return made


def check_finer(overrides: list[str], finer: list[str], ell_max: str) -> None:
    """ConfigError (one line) unless both configs and the cut compose, and the finer one keeps
    the analysis's cosmology, map and survey (only the simulation may differ)."""
    from fli.cli.common import compose  # noqa: PLC0415
    from fli.config import ConfigError  # noqa: PLC0415

    a, _ = compose(overrides)
    b, _ = compose([*overrides, *finer])
    compose([*overrides, f"lensing.ell_max=[{ell_max}]"])
    for what in ("cosmology", "survey", "lensing.fov_deg", "lensing.npix"):
        get = lambda c, w=what: functools.reduce(getattr, w.split("."), c)
        if get(a) != get(b):
            raise ConfigError(f"--finer changes {what}: the finer simulation must keep the analysis's cosmology, "
                              f"survey, lensing.fov_deg and lensing.npix (only how the universe is simulated differs)")


def _record(out: Path, keep: Path | None, i: int, mock: str, cut: str) -> Path | None:
    """The finished analysis's map.json: the study directory's, else the kept copy, else None."""
    run = out / f"pair_{i:03d}" / f"{mock}_{cut}" / "map.json"
    kept = keep / f"pair_{i:03d}_{mock}_{cut}.json" if keep else None
    return run if run.exists() else (kept if kept is not None and kept.exists() else None)


def _start(out: Path, keep: Path | None, i: int, mock: str, cut: str) -> list[str]:
    """Where an analysis's Newton iteration starts: the model mock's all-pixel analysis from the
    prior's median, the pair's three others from its estimate (``inference.map.muse.start``).
    The estimate is the root of MUSE's score, wherever the iteration starts; the pair's
    estimates lie close, so the three converge in fewer iterations, each needing fewer H's."""
    if (mock, cut) == ("model", "all"):
        return []
    rec = _record(out, keep, i, "model", "all")
    if rec is None:
        return []
    z = json.loads(rec.read_text())["muse"]["theta_z"]
    return [f"inference.map.muse.start=[{','.join(f'{v:.6f}' for v in z)}]"]


def analyse(out: Path, pairs: int, overrides: list[str], finer: list[str], ell_max: str, core: int,
            keep: Path | None, mocks_only: bool) -> None:
    cuts = {"all": [], "cut": [f"lensing.ell_max=[{ell_max}]"]}
    for i in range(pairs):
        pair = out / f"pair_{i:03d}"
        if all(_record(out, keep, i, m, c) for m in MOCKS for c in cuts) or not claim(out, i):
            continue
        t0 = time.time()
        if not all((pair / m / "observation.zarr" / "COMPLETE").exists() for m in MOCKS):
            pair.mkdir(parents=True, exist_ok=True)
            make_pair(out, i, overrides, finer)
        if mocks_only:
            continue
        for m in MOCKS:
            for c, extra in cuts.items():
                name = f"pair_{i:03d}_{m}_{c}"
                if _record(out, keep, i, m, c):
                    continue
                run = pair / f"{m}_{c}"
                run_logged(["fli.cli.map", *overrides, *extra, *_start(out, keep, i, m, c), f"mock={pair / m}",
                            f"run_dir={run}", "inference.map.estimator=muse"], out / f"{name}.log", core)
                if keep is not None:
                    keep_record(run / "map.json", keep / f"{name}.json")
        print(f"[{time.strftime('%H:%M:%S')}] pair {i}: {time.time() - t0:.0f} s", flush=True)


def report(out: Path, pairs: int, keep: Path | None) -> dict:
    """Per pair and cut, S8 of both mocks and the shift (finer - model) over the model's MUSE sd."""
    rows, res = [], {"pairs": [], "summary": {}, "goal": "shift under 0.5 posterior sd with the cut"}
    for i in range(pairs):
        for c in ("all", "cut"):
            recs = {m: _record(out, keep, i, m, c) for m in MOCKS}
            if not all(recs.values()):
                continue
            d = {m: json.loads(p.read_text())["muse"] for m, p in recs.items()}
            s8 = {m: d[m]["params"]["S8"] for m in MOCKS}
            sd = d["model"]["sd"]["S8"]
            mc = float(np.hypot(d["model"]["mc_sd"]["S8"], d["finer"]["mc_sd"]["S8"])) / sd
            row = {"pair": i, "cut": c, "S8_model": s8["model"], "S8_finer": s8["finer"], "sd_model": sd,
                   "sd_finer": d["finer"]["sd"]["S8"], "shift_over_sd": (s8["finer"] - s8["model"]) / sd,
                   "mc_sd_of_shift_over_sd": mc, "converged": all(d[m]["converged"] for m in MOCKS)}
            rows.append(row)
            res["pairs"].append(row)
    for c in ("all", "cut"):
        sh = np.array([r["shift_over_sd"] for r in rows if r["cut"] == c])
        if sh.size:
            res["summary"][c] = {"pairs": int(sh.size), "mean_shift_over_sd": float(sh.mean()),
                                 "se": float(sh.std(ddof=1) / np.sqrt(sh.size)) if sh.size > 1 else None,
                                 "max_abs_shift_over_sd": float(np.abs(sh).max())}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="study directory (observations and analyses)")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--finer", required=True, help="overrides (space-separated) that make the finer simulation")
    ap.add_argument("--ell-max", default="300,600", help="lensing.ell_max of the cut analyses, one per bin")
    ap.add_argument("--core", type=int, default=0, help="the core fli-map runs are pinned to")
    ap.add_argument("--keep", type=Path, help="copy each finished analysis's map.json here; those count as done")
    ap.add_argument("--mocks-only", action="store_true", help="make the pairs' observations, analyse nothing")
    ap.add_argument("--json", type=Path, help="write the summary here too")
    ap.add_argument("overrides", nargs="*", help="the analysis config's overrides (after --)")
    a = ap.parse_args(argv)
    from fli.config import ConfigError  # noqa: PLC0415

    try:
        check_finer(a.overrides, a.finer.split(), a.ell_max)  # bad input stops here, before anything is written
        a.out.mkdir(parents=True, exist_ok=True)
        analyse(a.out, a.pairs, a.overrides, a.finer.split(), a.ell_max, a.core, a.keep, a.mocks_only)
    except ConfigError as e:
        print(f"model_error.py: {e}", file=sys.stderr)
        return 2
    if a.mocks_only:
        return 0
    res = report(a.out, a.pairs, a.keep)
    emit(res, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
