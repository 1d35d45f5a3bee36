"""Resume a sampler checkpoint on another device layout (a new allocation of a cluster job).

The flat latent's order depends on ``pdims`` (:mod:`fli.infer.posterior.layout`): each device's slice is
[its field block | its tail]. A checkpoint saved on one layout is restored here onto another
by a permutation of every flat-latent-sized vector (position, gradient, mass matrix and its
adaptation state): field cells follow their global (i, j, k) index, the cosmological latents
their index, the standard-normal dummies of the tails their order; dummies the new layout has
and the old one had not start at their prior's mode (0) with unit mass. The chain continues,
not bit for bit (the next momenta are drawn in the new order).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fli.infer.checkpoint import store as ckpt
from fli.infer.posterior.layout import FLAT_SPEC


def flat_positions(shape, pdims, n_params: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices in the flat vector of ``pdims`` of: every field cell (C order of the global
    ``[nx, ny, nz]``), every cosmological latent, every dummy (in vector order)."""
    nx, ny, nz = shape
    px, py = pdims
    bx, by = nx // px, ny // py
    nb, nt = bx * by * nz, max(1, n_params)
    slice_size = nb + nt
    i, j, k = np.meshgrid(np.arange(nx), np.arange(ny), np.arange(nz), indexing="ij")
    dev = (i // bx) * py + (j // by)
    local = ((i % bx) * by + (j % by)) * nz + k
    field = (dev * slice_size + local).reshape(-1)
    theta = nb + np.arange(n_params)
    tails = (np.arange(px * py)[:, None] * slice_size + nb + np.arange(nt)[None, :]).reshape(-1)
    dummies = tails[n_params:]
    return field, theta, dummies


def permutation(shape, old_pdims, new_pdims, n_params: int) -> np.ndarray:
    """``src [new_size]``: the old index each new entry comes from, -1 for a new dummy."""
    fo, to, do = flat_positions(shape, old_pdims, n_params)
    fn, tn, dn = flat_positions(shape, new_pdims, n_params)
    new_size = math.prod(new_pdims) * ((shape[0] // new_pdims[0]) * (shape[1] // new_pdims[1]) * shape[2]
                                       + max(1, n_params))
    src = np.full(new_size, -1, np.int64)
    src[fn], src[tn] = fo, to
    m = min(do.size, dn.size)
    src[dn[:m]] = do[:m]
    return src


def _fill(path: str) -> str:
    """What a new dummy entry holds in the vector at ``path`` (a keystr of the state)."""
    if "inverse_mass_matrix" in path or "mass_matrix_sqrt" in path:
        return "one"
    if "mm_state[1]" in path:
        return "count"  # Welford's m2: a unit variance over the window's count so far
    return "zero"


def restore_on_new_layout(ckpt_dir, step: int, template: dict, meta: dict, post):
    """Checkpoint ``step`` (saved on ``meta['pdims']``) onto ``template`` (this layout)."""
    lay = post.layout
    old_pdims, old_size = tuple(meta["pdims"]), int(meta["layout_size"])
    mesh = lay.mesh
    n_dev = math.prod(lay.pdims)
    flat_t, treedef = jax.tree_util.tree_flatten_with_path(template)

    def flat(leaf) -> bool:  # a flat-latent vector, with the chain axis first
        return len(leaf.shape) == 2 and leaf.shape[-1] == lay.size

    def old_leaf(leaf):
        if flat(leaf):
            spec = P(None, *FLAT_SPEC) if old_size % n_dev == 0 else P()
            return jax.ShapeDtypeStruct((leaf.shape[0], old_size), leaf.dtype, sharding=NamedSharding(mesh, spec))
        return leaf

    old_template = jax.tree_util.tree_unflatten(treedef, [old_leaf(leaf) for _, leaf in flat_t])
    state, _ = ckpt.restore_checkpoint(ckpt_dir, step, old_template)
    src = permutation(tuple(post.fwd.grid.shape), old_pdims, lay.pdims, post.prior.n)
    src_dev = jax.device_put(jnp.asarray(np.maximum(src, 0), jnp.int32), lay.sharding)
    new_mask = jax.device_put(jnp.asarray(src < 0), lay.sharding)
    flat_s = jax.tree_util.tree_flatten_with_path(state)[0]
    count = None
    for p, leaf in flat_s:
        if jax.tree_util.keystr(p).endswith("mm_state[2]"):
            count = leaf

    def move(x, fill, c):
        y = jnp.take(x, src_dev, axis=1)
        value = {"one": jnp.ones((x.shape[0], 1), x.dtype), "zero": jnp.zeros((x.shape[0], 1), x.dtype),
                 "count": (jnp.zeros((x.shape[0], 1), x.dtype) if c is None
                           else jnp.asarray(c, x.dtype).reshape(-1, 1))}[fill]
        return jnp.where(new_mask[None, :], value, y)

    out = []
    for (p, leaf), (_, tleaf) in zip(flat_s, flat_t, strict=True):
        if flat(tleaf):
            fill = _fill(jax.tree_util.keystr(p))
            leaf = jax.jit(move, static_argnums=1, out_shardings=tleaf.sharding)(leaf, fill, count)
        out.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, out)
