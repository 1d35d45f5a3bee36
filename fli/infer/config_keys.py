"""Which config keys may differ between runs that continue or join one another, and the one
way two resolved configs are compared.

Three questions, one comparison (:func:`differences`):

* **resume or extend** a fli-nuts run (:data:`SAMPLING_MAY_CHANGE`) or a fli-map run
  (:data:`MAP_MAY_CHANGE`): only keys that extend, re-place or re-report a run may change;
* **start a chain at a MAP** (``init=<fli-map run>``): the model parts (:data:`MODEL_PARTS`)
  must agree, except how gradients are taken (:data:`MODEL_NEUTRAL`);
* **combine chains** in fli-diagnose (:data:`CHAINS_MAY_DIFFER`): chains of one posterior may
  differ in their seed, start, draw counts, layout and sampler layout.

Keys are dotted prefixes: ``"inference.map"`` covers every key under it. Values compare as
config values: numbers by value (1 == 1.0, nan == nan), anything else by type and value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from typing import Any

from fli.config import ConfigError
from fli.store.files import jsonable

# where a run is, how it reports and what it ran on: never part of what it computes
PLACEMENT = ("run_dir", "progress", "compilation_cache", "distributed", "name")
# fli-diagnose's keys: they do not change a chain or a MAP (a checkpoint written before they
# existed lacks them)
DIAGNOSE = ("diagnose", "runs", "sweep")
# how the model is computed, not what it is: the gradients' route, and the halo (the padding each
# device paints its particles into; the same forward wherever they fit, and a halo too small stops
# the run: it is raised by a resume)
MODEL_NEUTRAL = ("simulation.adjoint", "simulation.halo", "simulation.on_overflow")
# fli-nuts's keys, which fli-map ignores
SAMPLER = tuple(f"inference.{k}" for k in ("kernel", "num_warmup", "num_samples", "max_tree_depth", "num_steps",
                                           "step_size", "target_accept", "chunk", "field_thin", "init_redraw",
                                           "init_theta",
                                           "chains_per_run", "sampler", "integrator", "mclmc_length",
                                           "mclmc_energy_error", "precondition", "precondition_rank",
                                           "precondition_points", "projections"))
# a fli-nuts run resumed or extended: more draws, another start or another MAP config
# (the observation is compared by its fingerprint, fli/store/manifest.py, not by the spelling of its path)
SAMPLING_MAY_CHANGE = ("inference.num_samples", "inference.map", *PLACEMENT, "init", "inference.init_redraw",
                       "inference.init_theta",
                       *DIAGNOSE, "mock", *MODEL_NEUTRAL)
# a fli-map run resumed: a larger budget, other stopping and reporting settings
MAP_MAY_CHANGE = ("inference.map.steps", "inference.map.tol", "inference.map.patience",
                  "inference.map.checkpoint_every", "inference.map.laplace", "inference.map.cg_tol",
                  "inference.map.cg_maxiter", "inference.map.compare_truth", "inference.map.estimator",
                  "inference.map.muse.iterations", "inference.map.muse.spread", "inference.map.muse.workers",
                  "inference.map.muse.j_sims", "inference.map.muse.estimate", *SAMPLER, *DIAGNOSE, "init",
                  *PLACEMENT, "mock", *MODEL_NEUTRAL)
# chains of one posterior: the start differs between chains on purpose (R-hat compares chains
# from spread starts), and both sampler layouts sample the same posterior
CHAINS_MAY_DIFFER = ("seed", *PLACEMENT, "init", "inference.num_samples", "inference.num_warmup",
                     "inference.chunk", "inference.field_thin", "inference.init_redraw", "inference.init_theta",
                     "inference.map",
                     "inference.chains_per_run", "inference.sampler", "inference.precondition",
                     "inference.precondition_rank", "inference.precondition_points", *DIAGNOSE, "mock",
                     *MODEL_NEUTRAL)
# what defines the posterior a MAP or a chain belongs to
MODEL_PARTS = ("simulation", "lensing", "survey", "prior")

# sampler keys that only some kernels read: a run of another kernel resumes (and its chains
# combine) whatever they hold. Adjusted MCLMC tunes its step to an acceptance rate, not to an
# energy error, and its trajectory length by its own rule
KERNEL_KEYS = {"inference.mclmc_energy_error": ("mclmc",), "inference.mclmc_length": ("mclmc",)}


def unread_by(kernel: str) -> tuple[str, ...]:
    """The :data:`KERNEL_KEYS` that ``inference.kernel = kernel`` never reads."""
    return tuple(key for key, readers in KERNEL_KEYS.items() if kernel not in readers)


# the particle planes' keys, which the mesh planes and the linear forward never read; the shift's
# shape, which pgd_alpha = 0 turns off
PARTICLE_PLANE_KEYS = ("lensing.subparticles", "lensing.pgd_alpha", "lensing.pgd_mu", "lensing.pgd_kl",
                       "lensing.pgd_ks")
PGD_SHAPE_KEYS = ("lensing.pgd_mu", "lensing.pgd_kl", "lensing.pgd_ks")


def _value(cfg: dict, dotted: str):
    """The value of a dotted key (:data:`ADDED`'s old value where a config made before it lacks it)."""
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return ADDED.get(dotted, _ABSENT)
        node = node[part]
    return node


def unread(cfg: dict) -> set[str]:
    """The dotted keys that a resolved config's own settings make irrelevant: sampler keys its
    kernel never reads (:data:`KERNEL_KEYS`), the particle planes' keys under mesh planes or the
    linear forward, the mass assignment under the linear forward, the shift's shape when it is
    off. :func:`differences` skips the keys that both sides leave unread."""
    out = set()
    kernel = _value(cfg, "inference.kernel")
    if isinstance(kernel, str):
        out |= set(unread_by(kernel))
    if _value(cfg, "simulation.forward") == "linear":  # no particles: nothing is painted
        out.add("simulation.assignment")
    if _value(cfg, "lensing.planes") == "mesh" or _value(cfg, "simulation.forward") == "linear":
        out |= set(PARTICLE_PLANE_KEYS)
    elif _same(_value(cfg, "lensing.pgd_alpha"), 0.0):
        out |= set(PGD_SHAPE_KEYS)
    return out


# keys added after runs were made, each with the value that does what runs did before it: a
# saved config without the key resumes under a config that holds that value (added keys count
# as differences otherwise)
ADDED = {"inference.mclmc_energy_error": 5e-4, "inference.projections": 0, "lensing.planes": "mesh",
         "lensing.subparticles": 1, "lensing.pgd_alpha": 0.0, "lensing.pgd_mu": 0.0, "lensing.pgd_kl": 0.4,
         "lensing.pgd_ks": 1.0, "lensing.ell_max": None, "inference.map.muse.h_steps": None,
         "inference.map.muse.start": None, "inference.map.muse.j_sims": None, "simulation.assignment": "cic",
         "inference.map.muse.estimate": "root", "inference.map.muse.precondition_rank": 0,
         "inference.map.muse.workers": 1}
ABSENT = "<absent>"
_ABSENT = object()


def under(key: str, prefix: str) -> bool:
    """Whether dotted ``key`` is ``prefix`` or lies under it."""
    return key == prefix or key.startswith(prefix + ".") or key.startswith(prefix + "[")


def differences(a: dict, b: dict, ignore: Sequence[str] = (), only: Sequence[str] | None = None
                ) -> list[tuple[str, Any, Any]]:
    """``[(dotted key, value in a, value in b)]`` where two resolved configs differ, in
    ``a``'s order then keys new in ``b``; a key missing on one side has the value
    :data:`ABSENT`. Keys under ``ignore`` are skipped; with ``only``, only keys under it count.
    A key of :data:`ADDED` missing on one side and at its old behaviour's value on the other is
    no difference, nor is a key that both configs leave unread (:func:`unread`)."""
    a, b = jsonable(a), jsonable(b)
    skip = unread(a) & unread(b)
    out = []
    for key, x, y in _walk(a, b, ""):
        if any(under(key, p) for p in ignore) or (only is not None and not any(under(key, p) for p in only)):
            continue
        if key in skip:
            continue
        if key in ADDED and ((x is _ABSENT and _same(ADDED[key], y)) or (y is _ABSENT and _same(ADDED[key], x))):
            continue
        out.append((key, ABSENT if x is _ABSENT else x, ABSENT if y is _ABSENT else y))
    return out


def leaves(config: dict, ignore: Sequence[str] = ()) -> dict[str, Any]:
    """``{dotted key: value}`` of every leaf of a resolved config (lists are leaves), without
    the keys under ``ignore``."""
    out = {}

    def walk(x, key):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif not any(under(key, p) for p in ignore):
            out[key] = x

    walk(jsonable(config), "")
    return out


def _walk(a, b, key: str) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in [*a, *(k for k in b if k not in a)]:
            sub = f"{key}.{k}" if key else str(k)
            yield from _walk(a.get(k, _ABSENT), b.get(k, _ABSENT), sub)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _walk(x, y, f"{key}[{i}]")
    elif not _same(a, b):
        yield key, a, b


def _same(a, b) -> bool:
    """Equal config values: numbers by value (1 == 1.0, nan == nan), anything else by type and
    value (True is not 1, "1" is not 1)."""
    if _is_number(a) and _is_number(b):
        return a == b or (math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def show(x) -> str:
    """A config value for a message: strings quoted ("100" and 100 must not read alike)."""
    text = json.dumps(x)
    return text if len(text) <= 80 else text[:77] + "..."


def check_resumable(saved: dict, current: dict, may_change: Sequence[str] = (), *,
                    where: str | None = None) -> None:
    """Refuse to resume when the resolved config changed outside ``may_change``.

    Args:
        saved: the resolved config stored in the checkpoint's meta (nested plain dicts/lists).
        current: this run's resolved config (``OmegaConf.to_container(cfg, resolve=True)``).
        may_change: dotted key prefixes that may differ (:data:`SAMPLING_MAY_CHANGE`, ...).
        where: how the message names the checkpoint; default ``run_dir <current run_dir>``.
    Raises:
        ConfigError: naming the first differing dotted key (in the saved config's order, then
            keys new in ``current``) and both values; added and removed keys count.
    """
    if where is None:
        where = f"run_dir {current['run_dir']}" if "run_dir" in current else "the checkpoint"
    for key, x, y in differences(saved, current, ignore=may_change):
        if x is ABSENT and key in ADDED:  # made before the key existed: say which value does what it did
            what = (f"was made without {key}, as {key}={show(ADDED[key])} does; this run has {key} = {show(y)}, so "
                    f"add {key}={show(ADDED[key])} to resume it")
            raise ConfigError(f"{where} {what}")
        if x is ABSENT:
            what = f"was made without {key}; this run has {key} = {show(y)}"
        elif y is ABSENT:
            what = f"was made with {key} = {show(x)}; this run has no {key}"
        else:
            what = f"was made with {key} = {show(x)}; this run has {show(y)}"
        raise ConfigError(f"{where} {what}: use another run_dir or the same config")
