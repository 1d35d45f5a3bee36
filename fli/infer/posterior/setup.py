"""The set-up every inference command shares: the observation read and checked against the
config, the posterior built on the config's device mesh, and the data placed on it (no writes)."""

from __future__ import annotations

import logging

from fli.config import Config, ConfigError
from fli.infer.posterior.model import build_posterior, make_data


def prepare(cfg: Config, log: logging.Logger, compare_truth: bool = True):
    """Read and check the observation, build the posterior and place the data (no writes);
    ``compare_truth``: check ``inference.map.compare_truth`` against the observation."""
    from fli.store.io import check_observation, load_observation  # noqa: PLC0415
    from fli.sim.sharding import make_mesh  # noqa: PLC0415

    if cfg.mock is None:
        raise ConfigError("mock is not set: give the observation, mock=<run dir of fli-mock or an observation dir>")
    mesh = make_mesh(cfg.distributed.pdims)
    obs = load_observation(cfg.mock, mesh)
    check_observation(obs, cfg)
    want = cfg.inference.map.compare_truth
    if compare_truth and want and not obs.has_truth:
        raise ConfigError(f"inference.map.compare_truth is true but {obs.path} has no truth (kappa_true, "
                          f"white_noise): r(k) and r_ell need a mock; set inference.map.compare_truth=null")
    post = build_posterior(cfg, obs, mesh=mesh, log=log)
    data = make_data(obs, post.fwd, post.ell_max)
    return obs, post, data
