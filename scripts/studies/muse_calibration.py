#!/usr/bin/env python
"""Are MUSE's error bars honest? Pulls of MUSE and of the joint MAP over mocks drawn from the prior.

For mock ``i`` the truth's standardised parameters are drawn from N(0, I) (``numpy`` seed
``1000 + i``) and mapped through the prior; ``fli-mock`` makes the mock at that cosmology with
``seed=i``; ``fli-map inference.map.estimator=muse seed=i`` analyses it at the config's own
cosmology, as a user who does not know the truth would. The seed gives each mock its own MUSE
simulations (their keys are ``fold_in`` of a stream apart from the mock's): with one seed for
every mock they would share one draw of J and of the simulations' mean score, and the pulls
would test that draw more than MUSE. Each command is its own process, one at a time,
pinned to one core (``--core``, default 0) under ``nice -n 19`` (tests and CI keep the cores).
Two drivers on two cores share a study: each takes a mock by creating ``claim_<i>`` (holding
its process id) and skips mocks another live driver holds; a claim whose process is gone is
taken over, so an interrupted mock is resumed by whichever driver comes to it.

Reported per parameter (Omega_c, sigma8, S8), over the mocks:

* MUSE's pull ``(value - truth) / sd``, with value and sd the mean and sd of MUSE's latent
  Gaussian pushed through the prior (recomputed here from each map.json's record and
  ``cov_z``; the Gaussian's mean is the posterior's mean given the score, taken from the
  record whichever ``inference.map.muse.estimate`` wrote it,
  ``fli.infer.muse.result.estimates_of_record``): its mean must be within ``3 / sqrt(M)`` of 0
  and its sd within ``1 +- 3 / sqrt(2 M)`` (issue 21's criterion); the same in the standardised
  latents, where MUSE's Gaussian lives, and as the truth's quantile under that Gaussian (a
  normal score, for S8 too); and the pull of the root of F (``estimate=root``) beside it;
* the joint MAP's pull with its marginal Laplace sd, beside it;
* MUSE's sd over the prior's sd (the prior's S8 sd from 200000 prior draws): how far the data
  narrow the prior, so that the check can fail.

Resumable: a mock or an analysis already finished is passed over, and ``fli-map`` resumes its
own runs (MUSE fit by fit). ``--report-only`` summarises what is there. ``--keep DIR`` copies each
finished analysis's ``map.json`` (a few kB) to ``DIR/map_<i>.json`` and counts those as finished
too: a study that outlives its machine (the study directory is scratch; ``DIR`` is committed)
resumes at the first mock with no record. A mock still being analysed has its finished fits'
scores copied to ``DIR/partial_<i>/`` every few minutes (kB; removed once its map.json is
kept), and a new machine resumes it from them, fit by fit.

    nice -n 19 python -m scripts.studies.muse_calibration --out /work/studies/muse_linear --mocks 50 \\
        --json docs/bench/muse_calibration_linear.json -- \\
        experiment=tiny simulation.forward=linear survey.sigma_e=0.05
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
from scripts.studies.study import claim as _claim  # noqa: E402
from scripts.studies.study import emit, keep_record  # noqa: E402
from scripts.studies.study import run_logged as _run  # noqa: E402

PARAMS = ("Omega_c", "sigma8", "S8")


def _prior(overrides: list[str]):
    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.infer.posterior.priors import PriorTransform  # noqa: PLC0415

    cfg, _ = compose(overrides)
    return cfg, PriorTransform.from_config(cfg.prior)


def _truth(prior, i: int) -> dict[str, float]:
    z = np.random.default_rng(1000 + i).standard_normal(prior.n)
    return {n: float(v) for n, v in zip(prior.names, np.asarray(prior(z)), strict=True)}


def _records(out: Path, keep: Path | None) -> dict[int, Path]:
    """Every finished analysis's map.json by mock index: the study directory's, else the kept copy."""
    found = {int(p.name[4:7]): p for p in sorted(keep.glob("map_*.json"))} if keep else {}
    found.update({int(p.parent.name[4:7]): p for p in sorted(out.glob("map_*/map.json"))})
    return dict(sorted(found.items()))


def _keep(run: Path, keep: Path | None, i: int) -> None:
    if keep is not None and not (keep / f"map_{i:03d}.json").exists():
        keep_record(run / "map.json", keep / f"map_{i:03d}.json")


SAVE_EVERY = 300.0  # [s] between copies of a running analysis's progress to --keep


def _fingerprint(mock: Path) -> str | None:
    try:
        return json.loads((mock / "mock.zarr" / "zarr.json").read_text())["attributes"]["fli_fingerprint"]
    except (OSError, ValueError, KeyError):
        return None


def _save_partial(run: Path, mock: Path, keep: Path | None, i: int, overrides: list[str]) -> None:
    """Copy an unfinished MUSE run's progress, the scores of its finished fits (kB), to
    ``keep/partial_<i>/`` with the mock's fingerprint and the overrides, so that a study whose
    scratch directory does not outlive the machine resumes fit by fit (fli-map repeats the joint
    MAP, and MUSE only the fits it lacks)."""
    scores = sorted(run.glob("muse_scores*.jsonl"))
    if keep is None or (run / "map.json").exists() or not scores:
        return
    dst = keep / f"partial_{i:03d}"
    for p in [*scores, *run.glob("muse_iterations.jsonl")]:
        keep_record(p, dst / p.name)
    meta = {"fingerprint": _fingerprint(mock), "overrides": overrides}
    if not (dst / "partial.json").exists() or json.loads((dst / "partial.json").read_text()) != meta:
        (dst / "partial.json").write_text(json.dumps(meta) + "\n")


def _restore_partial(run: Path, mock: Path, keep: Path | None, i: int, overrides: list[str]) -> None:
    """Put ``keep/partial_<i>/``'s scores into a new run directory, if they belong to this mock
    (its fingerprint) and these overrides; otherwise say why they are not used."""
    src = keep / f"partial_{i:03d}" if keep is not None else None
    if src is None or not (src / "partial.json").exists() or (run / "muse_scores.jsonl").exists():
        return
    meta = json.loads((src / "partial.json").read_text())
    want = {"fingerprint": _fingerprint(mock), "overrides": overrides}
    if meta != want:
        what = "mock" if meta.get("fingerprint") != want["fingerprint"] else "overrides"
        print(f"mock {i}: {src} holds fits of another {what}; not used (remove it to silence this)", flush=True)
        return
    run.mkdir(parents=True, exist_ok=True)
    for p in src.glob("muse_*.jsonl"):
        shutil.copyfile(p, run / p.name)
    print(f"mock {i}: resuming from the fits kept in {src}", flush=True)


def analyse(out: Path, mocks: int, overrides: list[str], core: int = 0, keep: Path | None = None,
            save_every: float = SAVE_EVERY, first: int = 0) -> None:
    _, prior = _prior(overrides)
    for i in range(first, mocks):
        mock, run = out / f"mock_{i:03d}", out / f"map_{i:03d}"
        if (run / "map.json").exists():
            _keep(run, keep, i)  # finished before --keep was given
        if i in _records(out, keep) or not _claim(out, i):
            continue
        truth = _truth(prior, i)
        t0 = time.time()
        if not (mock / "mock.zarr" / "COMPLETE").exists():
            shutil.rmtree(mock, ignore_errors=True)  # a mock cut short is made again
            _run(["fli.cli.mock", *overrides, *(f"cosmology.{k}={v!r}" for k, v in truth.items()), f"seed={i}",
                  f"run_dir={mock}"], out / f"mock_{i:03d}.log", core)
        analysis = [*overrides, f"seed={i}"]  # a partial kept under another seed holds other simulations
        _restore_partial(run, mock, keep, i, analysis)
        _run(["fli.cli.map", *analysis, f"mock={mock}", f"run_dir={run}", "inference.map.estimator=muse"],
             out / f"map_{i:03d}.log", core, every=(save_every, lambda: _save_partial(run, mock, keep, i, analysis)))
        _keep(run, keep, i)
        if keep is not None:
            shutil.rmtree(keep / f"partial_{i:03d}", ignore_errors=True)  # map.json is kept: the fits are done
        print(f"[{time.strftime('%H:%M:%S')}] mock {i}: {time.time() - t0:.0f} s", flush=True)


class _Base:  # the fixed parameters S8 needs besides the sampled ones (Omega_b of the default cosmology)
    Omega_b = None

    def __init__(self):
        if _Base.Omega_b is None:
            from fli.cli.compose import compose  # noqa: PLC0415

            _Base.Omega_b = compose([])[0].cosmology.Omega_b


def _physical(prior, draws: np.ndarray) -> dict:
    """The sampled parameters and Omega_m, S8 of latent draws ``[N, n]`` (host arrays)."""
    import jax.numpy as jnp  # noqa: PLC0415

    from fli.infer.posterior.params import with_derived  # noqa: PLC0415

    phys = np.stack([np.asarray(prior._one(j, jnp.asarray(draws[:, j]))) for j in range(prior.n)], 1)
    return with_derived({n: phys[:, j] for j, n in enumerate(prior.names)}, _Base())


def _prior_sd(prior, name: str) -> float:
    return float(np.std(_physical(prior, np.random.default_rng(0).standard_normal((200_000, prior.n)))[name]))


def _muse_physical(prior, muse: dict, truth: dict) -> dict:
    """MUSE's physical mean and sd, recomputed from its latent Gaussian (``theta_z``, ``cov_z``)
    with the library's pushforward, so that analyses written by older code are summarised the
    same way; and the truth's quantile under that Gaussian as a normal score (the probit of its
    CDF: N(0, 1) over mocks if MUSE's Gaussian is calibrated, whatever its shape in physical
    units; 200000 draws, an error of about 0.005 in the score)."""
    import jax  # noqa: PLC0415

    from fli.infer.posterior.priors import gaussian_pushforward  # noqa: PLC0415

    z, cov = np.asarray(muse["theta_z"]), np.asarray(muse["cov_z"])
    names = list(_physical(prior, z[None]).keys())
    with jax.enable_x64(True):
        mean, c = gaussian_pushforward(z, cov, lambda t: np.stack(list(_physical(prior, t).values()), 1))
        draws = _physical(prior, np.random.default_rng(0).multivariate_normal(z, cov, 200_000))
    from scipy.stats import norm  # noqa: PLC0415

    return {k: {"mean": float(mean[i]), "sd": float(np.sqrt(c[i, i])),
                "quantile_pull": float(-norm.ppf(np.clip(np.mean(draws[k] < truth[k]), 1e-6, 1 - 1e-6)))}
            for i, k in enumerate(names) if k in truth}


def report(out: Path, overrides: list[str], keep: Path | None = None) -> dict:
    _, prior = _prior(overrides)
    rows, index = [], []
    for i, run in _records(out, keep).items():
        d = json.loads(run.read_text())
        if "muse" not in d or "truth" not in d:
            continue
        rows.append(d)
        index.append(i)
    m = len(rows)
    if m == 0:
        raise SystemExit(f"no finished analysis under {out}")
    res = {"mocks": m, "overrides": overrides, "criterion": {"mean_within": 3 / math.sqrt(m),
                                                              "sd_within": 3 / math.sqrt(2 * m)}, "params": {}}
    from fli.infer.muse.result import estimates_of_record  # noqa: PLC0415

    zt = np.array([[*np.asarray(prior.inverse([r["truth"][n] for n in prior.names]))] for r in rows])
    est = [estimates_of_record(r["muse"]) for r in rows]  # both estimates, whichever one a record reports
    zm = np.array([e["posterior"] for e in est])
    zsd = np.array([r["muse"]["sd_z"] for r in rows])
    phys, phys_root = ([_muse_physical(prior, {"theta_z": e[kind], "cov_z": r["muse"]["cov_z"]}, r["truth"])
                        for r, e in zip(rows, est, strict=True)] for kind in ("posterior", "root"))
    pulls = lambda ph_all, name: np.array([(ph[name]["mean"] - r["truth"][name]) / ph[name]["sd"]
                                           for r, ph in zip(rows, ph_all, strict=True)])
    for name in PARAMS:
        muse, root = pulls(phys, name), pulls(phys_root, name)
        quant = np.array([ph[name]["quantile_pull"] for ph in phys])
        lap = [((r.get("laplace") or {}).get("marginal") or {}).get("std", {}).get(name) for r in rows]
        jpull = [(r["params"][name] - r["truth"][name]) / s if s else None for r, s in zip(rows, lap, strict=True)]
        joint = np.array([j for j in jpull if j is not None])
        ratio = float(np.mean([ph[name]["sd"] for ph in phys])) / _prior_sd(prior, name)
        p = {"muse_pull_mean": float(muse.mean()), "muse_pull_sd": float(muse.std(ddof=1)),
             "root_pull_mean": float(root.mean()), "root_pull_sd": float(root.std(ddof=1)),
             "muse_quantile_pull_mean": float(quant.mean()), "muse_quantile_pull_sd": float(quant.std(ddof=1)),
             "muse_sd_over_prior_sd": ratio,
             "muse_mc_sd_over_sd": float(np.mean([r["muse"]["mc_sd"][name] / ph[name]["sd"]
                                                  for r, ph in zip(rows, phys, strict=True)]))}
        if joint.size:
            p.update(joint_pull_mean=float(joint.mean()), joint_pull_sd=float(joint.std(ddof=1)))
        if name in prior.names:
            j = prior.names.index(name)
            pz = (zm[:, j] - zt[:, j]) / zsd[:, j]
            p.update(muse_pull_z_mean=float(pz.mean()), muse_pull_z_sd=float(pz.std(ddof=1)))
        p["passes"] = bool(abs(p["muse_pull_mean"]) < res["criterion"]["mean_within"]
                           and abs(p["muse_pull_sd"] - 1) < res["criterion"]["sd_within"])
        res["params"][name] = p
        res.setdefault("per_mock", {str(i): {} for i in index})
        for i, mp, rp, jp in zip(index, muse, root, jpull, strict=True):
            res["per_mock"][str(i)][name] = {"muse_pull": float(mp), "root_pull": float(rp), "joint_pull": jp}
    res["not_converged"] = sum(not r["muse"]["converged"] for r in rows)
    res["not_converged_mocks"] = [i for i, r in zip(index, rows, strict=True) if not r["muse"]["converged"]]
    res["mock_indices"] = index
    res["muse_grad_evals_mean"] = float(np.mean([r["muse"]["grad_evals"] for r in rows]))
    res["muse_seconds_mean"] = float(np.mean([r["muse"]["seconds"] for r in rows]))
    return res


def figure(res: dict, path: Path) -> Path:
    """Each mock's pull of MUSE and of the joint MAP, per parameter, against N(0, 1)'s 1 and 2 sd
    bands (a symmetric-log axis, shared, grown to hold every pull: the joint MAP's reach 10-40)."""
    from fli.plots import save_figure  # noqa: PLC0415

    return save_figure(draw_pulls(res), path)


def draw_pulls(res: dict):
    """:func:`figure`'s matplotlib figure, unsaved."""
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    from fli.plots import pyplot  # noqa: PLC0415

    plt = pyplot()
    mocks = sorted(res["per_mock"], key=int)
    fig, axes = plt.subplots(1, len(PARAMS), figsize=(4.2 * len(PARAMS), 3.4), sharey=True)
    # the joint MAP's sigma8 pulls reach 40 on the linear forward
    pulls = [v for m in res["per_mock"].values() for p in PARAMS for k in ("muse_pull", "root_pull", "joint_pull")
             if (v := m[p].get(k)) is not None]
    top = max(25.0, 1.25 * max(map(abs, pulls), default=0.0))
    for ax, name in zip(axes, PARAMS, strict=True):
        x = np.array([int(i) for i in mocks])
        for k, sty in ((2, "0.93"), (1, "0.82")):
            ax.axhspan(-k, k, color=sty, zorder=0)
        ax.axhline(0, color="0.5", lw=0.8)
        muse = [res["per_mock"][i][name]["muse_pull"] for i in mocks]
        p = res["params"][name]
        ax.plot(x, muse, "o", color="C1", label=f"MUSE: mean {p['muse_pull_mean']:+.2f}, sd {p['muse_pull_sd']:.2f}")
        if "root_pull_mean" in p:  # the root of F, with the same sd
            ax.plot(x + 0.2, [res["per_mock"][i][name]["root_pull"] for i in mocks], ".", color="C0",
                    label=f"MUSE's root: mean {p['root_pull_mean']:+.2f}, sd {p['root_pull_sd']:.2f}")
        joint = [(int(i), res["per_mock"][i][name]["joint_pull"]) for i in mocks
                 if res["per_mock"][i][name]["joint_pull"] is not None]
        if joint:
            ax.plot(*zip(*joint, strict=True), "x", color="C3",
                    label=f"joint MAP: mean {p['joint_pull_mean']:+.1f}, sd {p['joint_pull_sd']:.1f}")
        ax.set_yscale("symlog", linthresh=3)
        ticks = [t for t in (-100, -50, -20, -10, -3, -2, -1, 0, 1, 2, 3, 10, 20, 50, 100) if abs(t) < top]
        ax.set_yticks(ticks, [str(t) for t in ticks])
        ax.set_ylim(-top, top)
        # at most 10 labelled mocks: one label per mock ran together past about 15 (the 50-mock figure)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=10, integer=True))
        ax.set_xlabel("mock")
        ax.set_title(name)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    axes[0].set_ylabel("(estimate - truth) / its sd")
    fig.suptitle(f"{res['mocks']} mocks: " + " ".join(res["overrides"]), fontsize=8)
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="study directory (mocks and analyses; resumable)")
    ap.add_argument("--mocks", type=int, default=50)
    ap.add_argument("--first", type=int, default=0, help="the first mock this driver takes (default 0): another "
                    "machine's share of the same study")
    ap.add_argument("--core", default="0", help="the core the commands are pinned to (default 0), or a list as taskset "
                    "takes it (0-12: all of a larger host)")
    ap.add_argument("--json", type=Path, help="write the summary here too")
    ap.add_argument("--figure", type=Path, help="draw each mock's pulls here (png)")
    ap.add_argument("--report-only", action="store_true", help="summarise the finished analyses; run nothing")
    ap.add_argument("--keep", type=Path, help="copy each finished analysis's map.json here, and count those as done")
    ap.add_argument("--save-every", type=float, default=SAVE_EVERY, help="seconds between copies of a running "
                    "analysis's fits to --keep (default %(default)s)")
    ap.add_argument("overrides", nargs="*", help="config overrides for both commands (after --)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.report_only:
        analyse(a.out, a.mocks, a.overrides, a.core, a.keep, a.save_every, a.first)
    res = report(a.out, a.overrides, a.keep)
    emit(res, a.json)
    if a.figure:
        figure(res, a.figure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
