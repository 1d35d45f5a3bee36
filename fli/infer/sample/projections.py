"""The field's data-constrained projections, recorded at every draw: mixing checks that can fail.

The white noise's power spectrum, which fli-diagnose reads for the field, is the prior's in
every direction the data do not constrain, and those are nearly all of them: a chain can mix
the prior's directions and stick in the data's without its P(k) showing it. The data constrain
the top eigenvectors ``v_k`` of the Gauss-Newton ``J^T J`` (DESIGN.md, "The geometry of the
posterior"; :mod:`fli.infer.sample.precondition`), so each draw's ``p_k = v_k . (z - ref)`` is what
a chain must move to be mixed. fli-diagnose gives their R-hat and ESS beside the parameters'.

Where the vectors come from:

* a preconditioned run (``inference.precondition=lowrank``): the preconditioner's own top
  ``inference.projections`` vectors, at no cost;
* otherwise, with ``inference.projections = K > 0``: a Lanczos pass of ``LANCZOS_FACTOR * K``
  steps at the MAP of ``init=<fli-map run>`` (its gradient evaluations counted in the run's
  summary), the top ``K`` kept and stored in the run (:data:`STORE`), so that a resume, an
  extension, and runs of other seeds from the same MAP project onto the same vectors (the
  Lanczos start is fixed).

``vecs`` is ``[K, size]`` sharded like the flat latent: the ``K`` numbers of a draw are local
dot products and one all-reduce.
"""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fli.config import Config, ConfigError
from fli.infer.fit.lowrank import VECS_SPEC, LowRank, build_lowrank, load_lowrank, save_lowrank
from fli.infer.posterior.model import Data, Posterior
from fli.infer.sample.precondition import init_map_point

STORE = "projections.zarr"  # in the run directory, where the run built its own vectors
LANCZOS_FACTOR = 3  # Lanczos steps per vector kept: the top Ritz vectors converge first, not at once


def top(pre: LowRank, k: int) -> LowRank:
    """The ``k`` leading eigenpairs of ``pre`` (its eigenvalues are largest first)."""
    k = min(int(k), int(pre.lam.shape[0]))
    mesh = pre.vecs.sharding.mesh
    vecs = jax.jit(lambda v: v[:k], out_shardings=NamedSharding(mesh, VECS_SPEC))(pre.vecs)
    return LowRank(pre.ref, vecs, jax.device_put(pre.lam[:k], NamedSharding(mesh, P())))


def project(proj: LowRank | None, z):
    """``[K]``: ``v_k . (z - ref)`` for the flat latent ``z``; ``[0]`` without vectors."""
    if proj is None:
        return jnp.zeros((0,), z.dtype)
    return jnp.einsum("kn,n->k", proj.vecs, z - proj.ref)


def projector_of(cfg: Config, post: Posterior, obs, data: Data, run_dir: Path, fresh: bool,
                 pre: LowRank | None, log: logging.Logger) -> tuple[LowRank | None, dict | None]:
    """The run's projection vectors and how they were made (None, None: none asked for)."""
    k = int(cfg.inference.projections)
    if k == 0:
        return None, None
    if pre is not None:
        proj = top(pre, k)
        log.info("projections: the preconditioner's top %d directions, recorded at every draw", proj.lam.shape[0])
        return proj, {"source": "preconditioner", "count": int(proj.lam.shape[0]), "grad_evals": 0}
    path = Path(run_dir) / STORE
    if path.exists():
        proj, info = load_lowrank(path, post)
        log.info("projections: read %s (%d directions, built at %s)", path, proj.lam.shape[0], info.get("point"))
        return proj, {**info, "grad_evals": 0}
    if not fresh:
        raise ConfigError(f"run_dir {run_dir} has checkpoints but no {STORE}: it was sampled without "
                          f"inference.projections; resume it with inference.projections=0")
    ref, how = init_map_point(cfg, post, obs, f"inference.projections={k} takes the data's directions at a MAP",
                              ", or inference.projections=0")
    full, info = build_lowrank(post, data, ref, LANCZOS_FACTOR * k, jax.random.PRNGKey(0), log)
    proj = top(full, k)
    info = {**info, "source": "lanczos", "count": int(proj.lam.shape[0]), "point": how,
            "eigenvalues": info["eigenvalues"][:k]}
    save_lowrank(path, post, proj, info)
    return proj, info
