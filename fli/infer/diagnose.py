"""``fli-diagnose``'s work: read the chains of fli-sample/fli-nuts runs, combine them, ArviZ's
diagnostics, verdicts.

The chains are read from the complete chunks of each run (``chunks/chunk_<i>`` with its
``DONE`` file, :func:`fli.infer.run_store.complete_chunks`), so a chain still sampling can be read
at any moment: a chunk being written (``chunks/.chunk_<i>.tmp``) is not looked at. Every
number comes from ArviZ 0.23's own functions on one InferenceData of the chains, truncated to
the shortest chain's post-warm-up draws:

* convergence: ``az.rhat`` (rank-normalised split R-hat), ``az.ess`` (bulk, tail),
  ``az.mcse`` (of the mean and of the standard deviation), per parameter (the sampled ones,
  ``Omega_m``, ``S8``), and the same per bin of the white noise's power spectrum of the draws
  (``field_summaries.pk_white_noise``), reported as their minimum and harmonic mean (not
  Vats' multivariate ESS, another quantity);
* sampler health: divergences after warm-up, ``az.bfmi`` (E-BFMI) per chain, the fraction of
  draws whose tree the run's ``inference.max_tree_depth`` cut short (NUTS: the tree reached
  that depth without a U-turn; a U-turn at the last doubling is told apart by the ``turning``
  statistic the kernel records), step size and acceptance per chain;
* efficiency: ESS per 1000 gradient evaluations and per hour of sampling, both summed over
  the chains' post-warm-up draws that were used (cumulative ``gradient_evals`` and ``seconds``
  of ``stats.npz``).

Each check has pass/warn bands (:class:`fli.config.DiagnoseConfig`); the overall verdict is the
worst check. Outputs (:func:`run_diagnose`): ``diagnostics.json``, ``chains.nc`` (the combined
InferenceData), figures and ``report.html`` (:mod:`fli.infer.diagnose_report`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path

import numpy as np

from fli.config import ConfigError, DiagnoseConfig
from fli.files import write_json
from fli.fingerprint import short
from fli.infer.config_keys import CHAINS_MAY_DIFFER, differences, leaves
from fli.infer.diagnose_convergence import constant, convergence, field_convergence, projection_convergence
from fli.infer.diagnose_sampler import sampler_health
from fli.infer.inference_data import add_field_summaries, quiet_arviz
from fli.infer.params import names_of_run
from fli.infer.run_store import (
    chains_of,
    chunks_being_written,
    complete_chunks,
    is_sampling_run,
    read_chunks,
    read_config,
)
from fli.manifest import SAMPLING, check_kind, kind_of, read_manifest, write_manifest

DIAGNOSTICS_JSON = "diagnostics.json"
CHAINS_NC = "chains.nc"
STAT_KEYS = ("diverging", "energy", "tree_depth", "n_steps", "step_size", "acceptance_rate", "lp", "gradient_evals",
             "energy_error", "turning")  # energy_error: MCLMC's; turning: NUTS's (each absent from runs before it)
VERDICTS = ("pass", "warn", "fail")
# exit statuses: a verdict's, apart from bad input's 2 (every fli command's) and a crash's 1
EXIT_STATUS = {"pass": 0, "warn": 3, "fail": 4}
BAD_INPUT = 2


@dataclasses.dataclass
class Chain:
    """One sampling run as read: its post-warm-up draws and the cumulative counters.

    ``draws``/``stats``/``pk``: post-warm-up values ``[n_post]`` (``pk`` ``[n_post, n_k]``);
    ``grads0``/``seconds0``: cumulative gradient evaluations and seconds before the first
    post-warm-up draw; ``k``: the spectra's bin centres [h/Mpc].
    """

    run: Path
    config: dict
    draws: dict
    stats: dict
    pk: dict
    k: np.ndarray
    n_warmup: int
    num_warmup: int
    chunks: list[int]
    grads0: float
    seconds0: float
    notes: list[str]
    observation: dict | None = None  # the run's manifest's observation (path, fingerprint)
    warmup_draws: dict | None = None  # the warm-up draws' parameters [n_warmup], for the warm-up trace

    @property
    def index(self) -> int:
        """The chain's index in its run: ``c`` of ``chain_<c>/``, else 0."""
        name = self.run.name
        return int(name[len("chain_"):]) if name.startswith("chain_") and name[6:].isdigit() else 0

    @property
    def run_dir(self) -> Path:
        """The run that sampled the chain: the parent of a vectorised run's ``chain_<c>/``, else itself."""
        return self.run.parent if self.run.name.startswith("chain_") else self.run

    @property
    def n_post(self) -> int:
        return int(self.draws["draw"].size)


# ================================================================ reading the runs


def find_runs(runs: list[str] | None, sweep: str | None) -> list[Path]:
    """The chains named by ``runs=[...]`` or by the job subdirectories of ``sweep=``: one per
    run directory, or each ``chain_<c>/`` of a run of several vectorised chains."""
    if not runs and not sweep:
        raise ConfigError("give the chains to diagnose: runs=[dir1,dir2] (fli-sample or fli-nuts run directories) "
                          "or sweep=<dir> (their multirun directory)")
    if runs and sweep:
        raise ConfigError("give runs=[...] or sweep=<dir>, not both")
    if runs:
        out = [Path(r) for r in runs]
        for r in out:
            if not r.is_dir():
                raise ConfigError(f"runs: {r} is not a directory (a fli-sample or fli-nuts run directory)")
        return [c for r in out for c in chains_of(r)]
    s = Path(sweep)
    if not s.is_dir():
        raise ConfigError(f"sweep={s} is not a directory (a fli-sample or fli-nuts multirun directory, e.g. "
                          "multirun/sample/<date>)")
    jobs = [p for p in s.iterdir() if p.is_dir() and not p.name.startswith(".") and is_sampling_run(p)]
    if not jobs:
        raise ConfigError(f"sweep={s} holds no fli-sample or fli-nuts job directory (none with chunks/ or config.yaml)")
    jobs = sorted(jobs, key=lambda p: (0, int(p.name)) if p.name.isdigit() else (1, p.name))
    return [c for j in jobs for c in chains_of(j)]


def read_chain(run: Path) -> Chain | str:
    """The chain of ``run``, or why it cannot be used (a sentence)."""
    run = Path(run)
    kind = kind_of(run)
    if kind is not None and kind not in SAMPLING:
        return f"{run} is a {kind} run, not a sampling run: give fli-sample or fli-nuts run directories"
    config = read_config(run)
    if config is None:
        return f"{run}: no config.yaml (not a fli-sample or fli-nuts run directory)"
    done = complete_chunks(run)
    notes = []
    writing = chunks_being_written(run)
    if writing:
        notes.append(f"{len(writing)} chunk(s) being written, not read ({', '.join(writing)})")
    if not done:
        return f"{run}: no complete chunk yet (no chain to read)" + (f"; {notes[0]}" if notes else "")
    contiguous = [i for j, i in enumerate(done) if i == j]
    if len(contiguous) < len(done):
        notes.append(f"chunks after {contiguous[-1] if contiguous else 'none'} skipped: chunk indices not "
                     f"contiguous ({done})")
    used, parts = [], []
    for i in contiguous:  # a chunk removed between listing and reading (a resume tidying up) ends the chain
        try:
            parts.append(read_chunks(run, [i]))
        except (OSError, ValueError, KeyError) as e:
            notes.append(f"chunk {i} unreadable, the chain stops before it ({type(e).__name__}: {e})")
            break
        used.append(i)
    if not used:
        return f"{run}: no readable complete chunk"
    c = {part: {name: (v if name == "k" else np.concatenate([q[part][name] for q in parts]))
                for name, v in parts[0][part].items()} for part in parts[0]}
    warm = np.asarray(c["draws"]["warmup"], bool)
    post = ~warm
    inf = config.get("inference", {}) or {}
    num_warmup = int(inf.get("num_warmup", int(warm.sum())))
    if not post.any():
        return (f"{run}: still in warm-up ({int(warm.sum())} of {num_warmup} warm-up draws done, no draw after "
                f"warm-up yet)")
    st = c["stats"]
    st = {**st, "lp": -np.asarray(st["potential_energy"])}
    i0 = int(np.argmax(post))
    grads0 = float(st["gradient_evals"][i0 - 1]) if i0 > 0 else float(st["gradient_evals"][0] - st["n_steps"][0])
    seconds0 = float(st["seconds"][i0 - 1]) if i0 > 0 else 0.0
    return Chain(run=run, config=config, draws={k: np.asarray(v)[post] for k, v in c["draws"].items()},
                 stats={k: np.asarray(v)[post] for k, v in st.items()},
                 pk={k: np.asarray(c["spectra"][k])[post] for k in ("pk_white_noise", "pk_linear", "projections")
                     if k in c["spectra"]},
                 k=np.asarray(c["spectra"]["k"]), n_warmup=int(warm.sum()), num_warmup=num_warmup, chunks=used,
                 grads0=grads0, seconds0=seconds0, notes=notes,
                 warmup_draws={k: np.asarray(v)[warm] for k, v in c["draws"].items()},
                 observation=(read_manifest(run) or read_manifest(run.parent) or {}).get("observation"))


def model_key(config: dict) -> dict:
    """The flattened config without the keys chains may differ on
    (:data:`fli.infer.config_keys.CHAINS_MAY_DIFFER`)."""
    return leaves(config, ignore=CHAINS_MAY_DIFFER)


def consistent(chains: list[Chain]) -> tuple[list[Chain], list[tuple[Path, str]]]:
    """The largest group of chains whose configs agree (ties: the first chain's group), and
    each other chain with the first key on which it differs."""
    keys = [json.dumps(model_key(c.config), sort_keys=True, default=str) for c in chains]
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    best = max(groups.values(), key=lambda g: (len(g), -g[0]))
    kept, dropped = [chains[i] for i in best], []
    for i, c in enumerate(chains):
        if i in best:
            continue
        diff = sorted(differences(chains[best[0]].config, c.config, ignore=CHAINS_MAY_DIFFER))
        k, there, here = diff[0]
        dropped.append((c.run, f"another model or config than {chains[best[0]].run}: {k} = "
                               f"{here!r} here, {there!r} there"
                               + (f" (and {len(diff) - 1} more key(s))" if len(diff) > 1 else "")))
    return kept, dropped


# ================================================================ the InferenceData


def combine(chains: list[Chain]):
    """One InferenceData of the chains' first ``n`` post-warm-up draws, ``n`` the shortest's:
    ``posterior`` (the parameters), ``sample_stats``, ``field_summaries`` (P(k) per draw)."""
    n = min(c.n_post for c in chains)
    names = names_of_run(chains[0].config)

    def stack(get):
        return np.stack([np.asarray(get(c))[:n] for c in chains])

    with quiet_arviz():
        import arviz as az  # noqa: PLC0415

        idata = az.from_dict(posterior={k: stack(lambda c, k=k: c.draws[k]) for k in names},
                             sample_stats={k: stack(lambda c, k=k: c.stats[k]) for k in STAT_KEYS
                                           if all(k in c.stats for c in chains)},
                             attrs={"runs": json.dumps([str(c.run) for c in chains]), "draws_per_chain": n})
        add_field_summaries(idata, {k: stack(lambda c, k=k: c.pk[k]) for k in ("pk_white_noise", "pk_linear",
                                                                              "projections")
                                    if all(k in c.pk for c in chains)}, chains[0].k)
    return idata


# ================================================================ numbers and verdicts


def efficiency(conv: dict, chains: list[Chain], n: int) -> dict:
    """ESS per 1000 gradient evaluations and per hour of sampling, over the draws used."""
    grads = sum(float(c.stats["gradient_evals"][n - 1]) - c.grads0 for c in chains)
    # a run of vectorised chains (its chain_<c>/) spent its time once for all of them, and each
    # chain records that whole time: one count per run
    per_run: dict[Path, float] = {}
    for c in chains:
        per_run[c.run_dir] = max(per_run.get(c.run_dir, 0.0), float(c.stats["seconds"][n - 1]) - c.seconds0)
    secs = sum(per_run.values())
    out = {"gradient_evals": grads, "seconds": secs,
           "note": "post-warm-up draws used, summed over the chains (seconds: the runs' sampling time added, "
                   "once for a run's vectorised chains; not the wall time of runs side by side)", "params": {}}
    for k, v in conv.items():
        e = {}
        for which in ("ess_bulk", "ess_tail"):
            ess = v[which]
            e[f"{which}_per_1000_grads"] = None if ess is None or grads <= 0 else 1000.0 * ess / grads
            e[f"{which}_per_hour"] = None if ess is None or secs <= 0 else 3600.0 * ess / secs
        out["params"][k] = e
    vals = [e["ess_bulk_per_1000_grads"] for e in out["params"].values()]
    out["ess_bulk_per_1000_grads_min"] = None if None in vals or not vals else min(vals)
    vals = [e["ess_bulk_per_hour"] for e in out["params"].values()]
    out["ess_bulk_per_hour_min"] = None if None in vals or not vals else min(vals)
    return out


def _band(value, good_pass, good_warn) -> str:
    """'pass' when good_pass(value), 'warn' when good_warn(value), else 'fail' (None fails)."""
    if value is None:
        return "fail"
    return "pass" if good_pass(value) else "warn" if good_warn(value) else "fail"


def checks(conv: dict, field: dict, health: dict, d: DiagnoseConfig, proj: dict | None = None) -> list[dict]:
    """Every check (R-hat, ESS, E-BFMI, divergences, tree depth), each with its number, bands and verdict."""
    out = []

    def add(name, what, value, verdict, bands, where=None):
        out.append({"check": name, "what": what, "value": value, "verdict": verdict, "bands": bands,
                    **({"where": where} if where else {})})

    def worst(key, fn):
        vals = {k: v[key] for k, v in conv.items()}
        if any(v is None for v in vals.values()):
            k = next(k for k, v in vals.items() if v is None)
            return None, k
        k = fn(vals, key=vals.get)
        return vals[k], k

    v, k = worst("rhat", max)
    add("rhat", "largest rank-normalised split R-hat of the parameters", v,
        _band(v, lambda x: x < d.rhat_pass, lambda x: x < d.rhat_warn),
        f"pass < {d.rhat_pass}, warn < {d.rhat_warn}", k)
    for which in ("ess_bulk", "ess_tail"):
        v, k = worst(which, min)
        add(which, f"smallest {which.split('_')[1]} ESS of the parameters", v,
            _band(v, lambda x: x > d.ess_pass, lambda x: x > d.ess_warn), f"pass > {d.ess_pass:g}, "
            f"warn > {d.ess_warn:g}", k)
    stuck = [f"{k} = {c['value']:.6g} in chain {c['chain']} ({c['draws']} draws)" for k, v in conv.items()
             for c in v.get("stuck", [])]
    add("stuck", "parameters that never move in a chain after warm-up (its ESS and R-hat are undefined)",
        len(stuck), "fail" if stuck else "pass", "pass none", "; ".join(stuck) or None)
    v = field["rhat_max"]
    add("field_rhat", "largest R-hat of the white noise's P(k) bins", v,
        _band(v, lambda x: x < d.rhat_pass, lambda x: x < d.rhat_warn), f"pass < {d.rhat_pass}, warn < {d.rhat_warn}")
    for which in ("ess_bulk", "ess_tail"):
        v = field[f"{which}_min"]
        add(f"field_{which}", f"smallest {which.split('_')[1]} ESS of the white noise's P(k) bins", v,
            _band(v, lambda x: x > d.ess_pass, lambda x: x > d.ess_warn),
            f"pass > {d.ess_pass:g}, warn > {d.ess_warn:g}")
    if proj is not None:  # the directions the data constrain, which P(k) does not see
        v = proj["rhat_max"]
        add("projection_rhat", f"largest R-hat of the field's {proj['count']} data-constrained projections", v,
            _band(v, lambda x: x < d.rhat_pass, lambda x: x < d.rhat_warn),
            f"pass < {d.rhat_pass}, warn < {d.rhat_warn}",
            None if proj["rhat_argmax"] is None else f"projection {proj['rhat_argmax']}")
        for which in ("ess_bulk", "ess_tail"):
            v = proj[f"{which}_min"]
            add(f"projection_{which}", f"smallest {which.split('_')[1]} ESS of the field's data-constrained "
                f"projections", v, _band(v, lambda x: x > d.ess_pass, lambda x: x > d.ess_warn),
                f"pass > {d.ess_pass:g}, warn > {d.ess_warn:g}")
    v = health["ebfmi_min"]
    worst_chain = None
    if v is not None:
        worst_chain = min(health["per_chain"], key=lambda p: p["ebfmi"])["run"]
    if all(p["kernel"].endswith("mclmc") for p in health["per_chain"]):
        add("ebfmi", "E-BFMI (MCLMC: not applicable, it has no Hamiltonian energy)", None, "n/a", "NUTS and HMC only")
    else:
        add("ebfmi", "smallest E-BFMI of the chains", v,
            _band(v, lambda x: x > d.bfmi_pass, lambda x: x > d.bfmi_warn), f"pass > {d.bfmi_pass}, "
            f"warn > {d.bfmi_warn}", worst_chain)
    if all(p["kernel"] == "mclmc" for p in health["per_chain"]):  # unadjusted: its bias grows with the error
        e = health.get("energy_error_ratio_max")
        worst = None if e is None else max(health["per_chain"], key=lambda p: p["energy_error_ratio"] or 0)
        add("energy_error", "largest ratio of a chain's energy-error variance per dimension to its target "
            "(MCLMC, inference.mclmc_energy_error)", e,
            _band(e, lambda x: x < d.energy_error_ratio_pass, lambda x: x < d.energy_error_ratio_warn),
            f"pass < {d.energy_error_ratio_pass:g}x, warn < {d.energy_error_ratio_warn:g}x the target",
            None if worst is None else f"{worst['run']}: {worst['energy_error_var_per_dim']:.3g} against "
                                       f"{worst['energy_error_target']:.3g}")
    frac = health["divergence_fraction"]
    add("divergences", f"divergences after warm-up ({health['divergences']} of {health['draws']} draws)", frac,
        _band(frac, lambda x: x == 0, lambda x: x < d.divergence_warn),
        f"pass none, warn < {100 * d.divergence_warn:g}% of the draws")
    v = health["tree_depth_saturation_max"]
    if v is None:
        add("tree_depth", "fraction of draws at max_tree_depth (not NUTS: not applicable)", None, "n/a", "NUTS only")
    else:
        per = health["per_chain"]
        uturn = max((p["max_depth_uturn"] or 0.0) for p in per)
        unrec = max((p["max_depth_unrecorded"] or 0.0) for p in per)
        add("tree_depth", "largest fraction of a chain's draws whose tree the depth cap ended (max_tree_depth "
            f"reached without a U-turn; U-turns at the last doubling, not counted: up to {100 * uturn:.1f}%"
            + (f"; with no record of why, counted as the cap: up to {100 * unrec:.1f}%" if unrec else "") + ")", v,
            _band(v, lambda x: x < d.tree_depth_pass, lambda x: x < d.tree_depth_warn),
            f"pass < {100 * d.tree_depth_pass:g}%, warn < {100 * d.tree_depth_warn:g}%")
    return out


def overall(items: list[dict]) -> str:
    vs = [c["verdict"] for c in items if c["verdict"] in VERDICTS]
    return max(vs, key=VERDICTS.index) if vs else "pass"


def diagnose_chains(chains: list[Chain], dcfg: DiagnoseConfig) -> tuple[dict, object]:
    """Every number and verdict of the chains (already consistent); returns (report, idata)."""
    idata = combine(chains)
    n = int(idata.posterior.sizes["draw"])
    names = names_of_run(chains[0].config)
    conv = convergence(idata, names)
    field = field_convergence(idata)
    proj = projection_convergence(idata)
    health = sampler_health(idata, chains)
    items = checks(conv, field, health, dcfg, proj)
    report = {"verdict": overall(items), "exit_status": EXIT_STATUS[overall(items)], "checks": items,
              "chains": len(chains), "draws_per_chain": n, "params": conv, "field": field, "projections": proj,
              "sampler": health,
              "efficiency": efficiency(conv, chains, n), "thresholds": dataclasses.asdict(dcfg)}
    return report, idata


def load(run_dirs: list[Path]) -> tuple[list[Chain], list[dict]]:
    """Read every run, keep the consistent ones; returns (chains, [{run, reason}] dropped).

    Raises ConfigError when no chain is left."""
    chains, dropped = [], []
    for r in run_dirs:
        c = read_chain(r)
        if isinstance(c, str):
            dropped.append({"run": str(r), "reason": c})
        else:
            chains.append(c)
    if not chains:
        why = "; ".join(d["reason"] for d in dropped)
        raise ConfigError(f"no chain to diagnose: {why}")
    chains, other = consistent(chains)
    dropped += [{"run": str(r), "reason": why} for r, why in other]
    chains, other = _one_observation(chains)
    dropped += [{"run": str(r), "reason": why} for r, why in other]
    chains, other = _distinct(chains)
    dropped += [{"run": str(r), "reason": why} for r, why in other]
    return chains, dropped


def _one_observation(chains: list[Chain]) -> tuple[list[Chain], list[tuple[Path, str]]]:
    """The chains of the first chain's observation (compared by fingerprint, else by resolved
    path), and each other chain with why it was dropped."""
    ref = chains[0]

    def ident(c: Chain):
        fp = (c.observation or {}).get("fingerprint")
        if fp is not None:
            return "fingerprint", fp
        mock = c.config.get("mock")
        return "path", str(Path(mock).resolve()) if mock else None

    kind, want = ident(ref)
    kept, dropped = [], []
    for c in chains:
        k, v = ident(c)
        if k != kind or v is None or want is None or v == want:
            kept.append(c)
        else:
            what = (f"fingerprint {short(v)} here, {short(want)} there" if k == "fingerprint" else
                    f"mock={c.config.get('mock')} here, {ref.config.get('mock')} there")
            dropped.append((c.run, f"sampled another observation than {ref.run}: {what}"))
    return kept, dropped


def _distinct(chains: list[Chain]) -> tuple[list[Chain], list[tuple[Path, str]]]:
    """Drop a chain that repeats an earlier one: identical draws, or the same seed and chain
    index (so the same random numbers) in another run; it adds no information, and R-hat and
    ESS would count it as independent."""
    kept, dropped, seen = [], [], {}
    for c in chains:
        draws = np.stack([np.asarray(c.draws[k], np.float64) for k in sorted(c.draws) if k not in ("draw", "warmup")])
        # chains stuck at the same point (a prior's edge) repeat no one's random numbers: kept, and failed as stuck
        key_draws = None if all(constant(d) for d in draws) else hashlib.sha256(draws.tobytes()).hexdigest()
        key_seed = ("seed", c.config.get("seed"), c.index)
        by_draws = seen.get(key_draws) if key_draws is not None else None
        first = by_draws or (seen.get(key_seed) if c.config.get("seed") is not None else None)
        if first is not None:
            why = ("identical draws" if by_draws is not None else
                   f"the same seed ({c.config.get('seed')}) and chain index")
            dropped.append((c.run, f"repeats the chain of {first.run} ({why}): not an independent chain; give each "
                                   f"run its own seed"))
            continue
        if key_draws is not None:
            seen.setdefault(key_draws, c)
        seen.setdefault(key_seed, c)
        kept.append(c)
    return kept, dropped


def chain_table(chains: list[Chain], n: int) -> list[dict]:
    out = []
    for c in chains:
        notes = list(c.notes)
        if c.n_post > n:
            notes.append(f"truncated to the shortest chain: {n} of its {c.n_post} post-warm-up draws used")
        if c.n_warmup < c.num_warmup:
            notes.append(f"warm-up incomplete ({c.n_warmup} of {c.num_warmup})")
        out.append({"run": str(c.run), "chunks": len(c.chunks), "warmup_draws": c.n_warmup,
                    "post_warmup_draws": c.n_post, "used": n, "seed": c.config.get("seed"), "notes": notes})
    return out


# ================================================================ the command


def run_diagnose(cfg, resolved: dict, run_dir: Path, log: logging.Logger) -> dict:
    """Diagnose ``cfg.runs`` or ``cfg.sweep`` into ``run_dir``; returns the report (the content
    of ``diagnostics.json``). Bad input raises ConfigError before anything is written."""
    run_dir = Path(run_dir)
    check_kind(run_dir, "fli-diagnose")
    runs = find_runs(list(cfg.runs) if cfg.runs else None, cfg.sweep)
    chains, dropped = load(runs)
    for d in dropped:
        log.warning("dropped %s: %s", d["run"], d["reason"])
    notes: list[str] = []
    if cfg.diagnose.figures:  # the truth is read (and a named mock= checked) before anything is written
        from fli.infer.diagnose_fields import truth_of  # noqa: PLC0415

        obs = truth_of(chains[0].config, notes, chains[0].observation, cfg.mock)
    report, idata = diagnose_chains(chains, cfg.diagnose)
    n = report["draws_per_chain"]
    report["runs"] = chain_table(chains, n)
    report["dropped"] = dropped
    if len({c.n_post for c in chains}) > 1:
        log.warning("chains of unequal length (%s post-warm-up draws): the first %d of each are used",
                    ", ".join(str(c.n_post) for c in chains), n)
    run_dir.mkdir(parents=True, exist_ok=True)
    with quiet_arviz():
        idata.to_netcdf(str(run_dir / CHAINS_NC), engine="h5netcdf")
    report["inference_data"] = str(run_dir / CHAINS_NC)
    if cfg.diagnose.figures:
        from fli.infer.diagnose_fields import figure_data  # noqa: PLC0415
        from fli.infer.diagnose_figures import figures  # noqa: PLC0415

        data = figure_data(idata, chains, cfg.diagnose, notes, obs)
        report["figures"], report["figure_notes"] = figures(
            idata, chains, data, run_dir, log, notes, cfg.diagnose.energy_error_ratio_pass), notes
    else:
        report["figures"], report["figure_notes"] = {}, ["diagnose.figures=false"]
    write_json(run_dir / DIAGNOSTICS_JSON, report)
    write_manifest(run_dir, "fli-diagnose", resolved)
    from fli.infer.diagnose_report import write_html  # noqa: PLC0415

    write_html(report, run_dir)
    print(summary_table(report))
    return report


def _fmt(x, spec=".3g") -> str:
    """``x`` formatted; a missing value is a dash right-aligned to the spec's width."""
    if x is not None:
        return format(x, spec)
    width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
    return "-".rjust(int(width)) if width else "-"


def summary_table(report: dict) -> str:
    """One screen: the chains, the parameters and the checks, with the overall verdict."""
    lines = [f"fli-diagnose: {report['chains']} chain(s), {report['draws_per_chain']} post-warm-up draws each"]
    for r in report.get("runs", []):
        note = f"  [{'; '.join(r['notes'])}]" if r["notes"] else ""
        lines.append(f"  {r['run']}: {r['post_warmup_draws']} draws after {r['warmup_draws']} warm-up, "
                     f"{r['used']} used{note}")
    for d in report.get("dropped", []):
        lines.append(f"  dropped {d['run']}: {d['reason']}")
    eff = report["efficiency"]["params"]
    lines.append(f"  {'param':<9}{'mean':>10}{'sd':>10}{'R-hat':>8}{'ESS bulk':>10}{'ESS tail':>10}"
                 f"{'MCSE':>10}{'ESS/1k grad':>12}{'ESS/h':>10}")
    for k, v in report["params"].items():
        lines.append(f"  {k:<9}{_fmt(v['mean'], '10.4g')}{_fmt(v['sd'], '10.3g')}{_fmt(v['rhat'], '8.3f')}"
                     f"{_fmt(v['ess_bulk'], '10.0f')}{_fmt(v['ess_tail'], '10.0f')}{_fmt(v['mcse_mean'], '10.2g')}"
                     f"{_fmt(eff[k]['ess_bulk_per_1000_grads'], '12.3g')}{_fmt(eff[k]['ess_bulk_per_hour'], '10.3g')}")
    f = report["field"]
    lines.append(f"  field P(k), {len(f['k'])} bins: ESS bulk min {_fmt(f['ess_bulk_min'], '.0f')}, harmonic mean "
                 f"{_fmt(f['ess_bulk_harmonic_mean'], '.0f')}; R-hat max {_fmt(f['rhat_max'], '.3f')}")
    for c in report["checks"]:
        v = c["value"]
        val = "-" if v is None else (f"{100 * v:.2f}%" if c["check"] in ("divergences", "tree_depth") else f"{v:.4g}")
        at = f" [{c['where']}]" if c.get("where") and c["verdict"] == "fail" else ""
        lines.append(f"  {c['verdict'].upper():<5} {c['check']:<20}{val:>10}  ({c['bands']}){at}")
    lines.append(f"verdict: {report['verdict'].upper()} (exit status {report['exit_status']})")
    return "\n".join(lines)
