"""``fli-diagnose``'s input: the chains of fli-sample/fli-nuts runs, read, checked against each
other and combined into one InferenceData.

A run's chains are read from its complete chunks only (a chain still sampling can be read at
any moment). Chains of another model config, of another observation, or repeating an earlier
chain (the same draws, or the same seed and chain index) are dropped, each with its reason;
the rest are truncated to the shortest chain's post-warm-up draws (:func:`combine`).
"""



from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np

from fli.config import ConfigError
from fli.store.fingerprint import short
from fli.infer.config_keys import CHAINS_MAY_DIFFER, differences, leaves
from fli.infer.diagnose.convergence import constant
from fli.infer.sample.inference_data import add_field_summaries, quiet_arviz
from fli.infer.posterior.params import names_of_run
from fli.infer.sample.run_store import (
    chains_of,
    chunks_being_written,
    complete_chunks,
    is_sampling_run,
    read_chunks,
    read_config,
)
from fli.store.manifest import SAMPLING, kind_of, read_manifest

STAT_KEYS = ("diverging", "energy", "tree_depth", "n_steps", "step_size", "acceptance_rate", "lp", "gradient_evals",
             "energy_error", "turning")  # energy_error: MCLMC's; turning: NUTS's (each absent from runs before it)

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
