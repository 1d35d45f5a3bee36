r"""A posterior-preconditioned latent: the samplers move ``y``, with ``z = ref + C^{1/2} y``.

The preconditioner's algebra and its Lanczos build are :mod:`fli.infer.fit.lowrank` (also what
MUSE's field fits use, :mod:`fli.infer.muse.field_fit`); here are the sampler's latent seen through
it, its storage in the run directory, where it is built (at a fli-map run's MAP) and the
linearised start drawn from it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from fli.config import Config, ConfigError
from fli.infer.fit.lowrank import VECS_SPEC, LowRank, build_lowrank, load_lowrank, save_lowrank, to_y, to_z
from fli.infer.posterior.model import Data, Posterior
from fli.infer.sample.base import LatentLayout, sharded_latent

STORE = "preconditioner.zarr"  # in the run directory: a resume or an extension uses the same one


# --------------------------------------------------------------------------- the latent


class Preconditioned(NamedTuple):
    """What the kernels of a preconditioned latent read as their ``data`` (an argument of every
    compiled program, never a constant folded into one)."""

    data: Data
    pre: LowRank


def lowrank_latent(post: Posterior) -> LatentLayout:
    """The sharded flat latent seen through a :class:`LowRank`: the kernel moves ``y`` and
    reads ``Preconditioned(data, pre)`` as its data; the potential is ``U(ref + C^{1/2} y)``
    (the map is linear, so its Jacobian is a constant and drops out)."""
    base = sharded_latent(post)
    lay = post.layout
    potential = jax.jit(lambda y, kd: post.potential_flat(to_z(kd.pre, y), kd.data, precise=True))
    return base._replace(name="sharded+lowrank", potential_gen=lambda kd: lambda y: potential(y, kd),
                         latents=lambda state, kd: lay.unpack(to_z(kd.pre, state.z)))


# --------------------------------------------------------------------------- stored with the run


def init_map_point(cfg: Config, post: Posterior, obs, what: str, otherwise: str = "") -> tuple[jax.Array, str]:
    """The flat latent of the MAP of ``init=<fli-map run>`` (checked to be of this observation)
    and that directory; ConfigError, starting with ``what``, where init is no such run."""
    from fli.infer.fit.map import load_map_field  # noqa: PLC0415
    from fli.infer.sample.start import check_init_map  # noqa: PLC0415

    how = (cfg.init or "prior").strip()
    if how in ("prior", "truth") or not Path(how).is_dir():
        raise ConfigError(f"{what}: set init=<a fli-map run directory of this mock> (init={how} is not one){otherwise}")
    mj = check_init_map(cfg, Path(how), obs)
    grid = post.fwd.grid
    ref = jax.jit(post.layout.pack)(jnp.asarray(post.theta_of(mj["params"]), grid.jdtype),
                                    load_map_field(how, grid.mesh).astype(grid.jdtype))
    return ref, how


def preconditioner_of(cfg: Config, post: Posterior, obs, data: Data, run_dir: Path, fresh: bool,
                      log: logging.Logger) -> tuple[LowRank, dict]:
    """The run's preconditioner: read from ``run_dir`` where it was stored, else (a new run)
    built at the MAP of ``init=<fli-map run>`` and stored before the first draw."""
    path = Path(run_dir) / STORE
    icfg = cfg.inference
    if path.exists():
        pre, info = load_lowrank(path, post)
        log.info("preconditioner: read %s (rank %d, built at %s)", path, pre.lam.shape[0], info.get("point"))
        return pre, info
    if not fresh:
        raise ConfigError(f"run_dir {run_dir} has checkpoints but no {STORE}: it was sampled without "
                          f"inference.precondition={icfg.precondition}; resume it as it was started")
    ref, how = init_map_point(cfg, post, obs, f"inference.precondition={icfg.precondition} is built at a MAP")
    grid = post.fwd.grid
    # a fixed start: the preconditioner is a function of the MAP alone, so runs of other seeds
    # from one MAP share it (and their draws' projections onto it compare)
    pre, info = build_lowrank(post, data, ref, icfg.precondition_rank, jax.random.PRNGKey(0), log)
    if icfg.precondition_points > 0:
        # the MAP sits where the forward is nearly linear (|s|^2 << D), and the curvature changes
        # between typical points (docs/benchmarks.md): average it over draws of the first pass
        keys = jax.random.split(jax.random.PRNGKey(1), icfg.precondition_points)
        at = jax.jit(jax.vmap(lambda k: to_z(pre, jax.random.normal(k, ref.shape, ref.dtype))),
                     out_shardings=NamedSharding(grid.mesh, VECS_SPEC))(keys)
        log.info("preconditioner: again, averaged over %d draws of the first one's linearised posterior",
                 icfg.precondition_points)
        first = info
        pre, info = build_lowrank(post, data, ref, icfg.precondition_rank, jax.random.PRNGKey(0), log, at=at)
        info["grad_evals"] += first["grad_evals"]
        info["seconds"] += first["seconds"]
    info = {**info, "point": how}
    save_lowrank(path, post, pre, info)
    return pre, info


def linearised_start(post: Posterior, pre: LowRank, key, theta_of=None) -> tuple[jax.Array, dict]:
    """A chain's start in the preconditioned latent: ``y ~ N(0, I)``, the linearised
    posterior's draw around the MAP, with theta then replaced (the joint MAP's theta is biased,
    DESIGN.md) by ``theta_of(key) -> (theta_z, label)`` (:func:`fli.infer.sample.start.start_theta`),
    by default a draw from its prior. Returns ``y`` and a description."""
    lay = post.layout
    k_y, k_t = jax.random.split(key)
    theta, label = theta_of(k_t) if theta_of is not None else (jax.random.normal(k_t, (post.prior.n,)), "prior")

    @jax.jit
    def draw(k_y, theta):
        y = jax.lax.with_sharding_constraint(jax.random.normal(k_y, (lay.size,), pre.ref.dtype), lay.sharding)
        _, s = lay.unpack(to_z(pre, y))
        return to_y(pre, lay.pack(theta, s, y))

    return draw(k_y, jnp.asarray(theta, pre.ref.dtype)), {"redraw": "linearised", "theta": label}
