"""Fingerprints: data that were damaged or swapped after writing are never read as valid.

The independent check is the stored bytes themselves: a chunk file deleted (zarr then reads its
fill value, zeros), truncated or rewritten must be refused, naming the array and the chunk,
on one device and on a sharded layout other than the one written; the same group under
another spelling of its path has the same fingerprint.
"""

import os
import shutil

import numpy as np
import pytest
import zarr

from fli.store.fingerprint import CHUNKS_ATTR, GROUP_ATTR, DamagedData, block_hash, read_verified
from fli.store.io import load_observation, write_arrays, write_observation
from fli.sim.sharding import make_mesh

RNG = np.random.default_rng(0)
KAPPA = RNG.normal(size=(2, 8, 8)).astype(np.float32)


def _observation(path):
    return write_observation(path / "observation.zarr", KAPPA, [0.1, 0.2], np.linspace(0, 2, 50),
                             np.ones((2, 50)), 5.0)


def test_a_written_observation_carries_its_fingerprint_under_any_spelling_of_its_path(tmp_path, monkeypatch):
    _observation(tmp_path / "obs")
    fp = load_observation(tmp_path / "obs").fingerprint
    assert fp is not None and len(fp) == 64
    monkeypatch.chdir(tmp_path)
    assert load_observation("obs/").fingerprint == fp
    assert load_observation("./obs/observation.zarr").fingerprint == fp
    os.symlink(tmp_path / "obs", tmp_path / "link")
    assert load_observation(tmp_path / "link").fingerprint == fp
    # the same numbers written again elsewhere: the same fingerprint; other numbers: another
    _observation(tmp_path / "copy")
    assert load_observation(tmp_path / "copy").fingerprint == fp
    write_observation(tmp_path / "other" / "observation.zarr", KAPPA + 1e-3, [0.1, 0.2], np.linspace(0, 2, 50),
                      np.ones((2, 50)), 5.0)
    assert load_observation(tmp_path / "other").fingerprint != fp


@pytest.mark.parametrize("array", ["kappa_obs", "noise_sigma"])
@pytest.mark.parametrize("mesh", [None, (2, 2)])
def test_a_deleted_chunk_is_refused_not_read_as_zeros(tmp_path, array, mesh):
    _observation(tmp_path / "obs")
    chunk = next(p for p in (tmp_path / "obs" / "observation.zarr" / array / "c").rglob("*") if p.is_file())
    chunk.unlink()
    # zarr alone reads the missing chunk as its fill value, without a word
    raw = np.asarray(zarr.open_group(str(tmp_path / "obs" / "observation.zarr"), mode="r")[array][...])
    assert not raw.any()
    with pytest.raises(DamagedData, match=f"{array}: chunk .* does not match the fingerprint"):
        load_observation(tmp_path / "obs", None if mesh is None else make_mesh(mesh))


def test_a_rewritten_or_truncated_chunk_is_refused(tmp_path):
    _observation(tmp_path / "obs")
    group = tmp_path / "obs" / "observation.zarr"
    z = zarr.open_group(str(group), mode="r+")["kappa_obs"]
    z[0, 0, 0] = 7.0  # written through zarr, behind fli's back: the recorded hash no longer matches
    with pytest.raises(DamagedData, match="kappa_obs: chunk 0.0.0"):
        load_observation(tmp_path / "obs")
    _observation(tmp_path / "obs2")
    f = next(p for p in (tmp_path / "obs2" / "observation.zarr" / "kappa_obs" / "c").rglob("*") if p.is_file())
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(DamagedData, match="kappa_obs: chunk 0.0.0 is unreadable"):  # it no longer decodes
        load_observation(tmp_path / "obs2")


def test_changed_attributes_or_a_swapped_array_break_the_group_fingerprint(tmp_path):
    _observation(tmp_path / "obs")
    _observation(tmp_path / "b")
    write_observation(tmp_path / "c" / "observation.zarr", KAPPA * 2, [0.1, 0.2], np.linspace(0, 2, 50),
                      np.ones((2, 50)), 5.0)
    g = zarr.open_group(str(tmp_path / "obs" / "observation.zarr"), mode="r+")
    g.attrs.update({"fov_deg": 6.0})
    with pytest.raises(DamagedData, match="no longer matches the fingerprint .*: its attributes changed"):
        load_observation(tmp_path / "obs")
    # kappa_obs of another observation put in its place, its own chunk hashes with it
    shutil.rmtree(tmp_path / "b" / "observation.zarr" / "kappa_obs")
    shutil.copytree(tmp_path / "c" / "observation.zarr" / "kappa_obs", tmp_path / "b" / "observation.zarr" / "kappa_obs")
    with pytest.raises(DamagedData, match=r"array\(s\) replaced: \['kappa_obs'\]"):
        load_observation(tmp_path / "b")


def test_read_verified_returns_any_block_across_chunks(tmp_path):
    x = RNG.normal(size=(8, 6, 5)).astype(np.float32)
    mesh = make_mesh((2, 2))
    import jax

    from fli.sim.sharding import field_sharding

    write_arrays(tmp_path / "g.zarr", {"x": jax.device_put(x, field_sharding(mesh))}, {})
    z = zarr.open_group(str(tmp_path / "g.zarr"), mode="r")["x"]
    assert z.chunks == (4, 3, 5) and len(dict(z.attrs)[CHUNKS_ATTR]) == 4
    assert GROUP_ATTR in dict(zarr.open_group(str(tmp_path / "g.zarr"), mode="r").attrs)
    for idx in [(slice(None),) * 3, (slice(1, 7), slice(2, 5), slice(0, 5)), (slice(3, 4), slice(0, 6), slice(1, 2))]:
        np.testing.assert_array_equal(read_verified(z, idx), x[idx])
    assert block_hash(x) != block_hash(x.astype(np.float64))  # the dtype is part of the hash


def test_zero_size_arrays_are_written_fingerprinted_and_read_back(tmp_path):
    """A preconditioner built at fixed cosmology (``prior.sample=[]``) stores a theta of no
    values, whose chunks are its shape, 0: the fingerprint's chunk grid divided by it. Such an
    array is one empty chunk, hashed alike when written and when read back."""
    import jax.numpy as jnp

    from fli.store.fingerprint import record

    write_arrays(tmp_path / "g.zarr", {"theta": jnp.zeros((0,), jnp.float32), "vecs": np.zeros((3, 0)),
                                       "x": np.arange(4.0)}, {})
    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="r")
    assert read_verified(g["theta"]).shape == (0,) and read_verified(g["vecs"]).shape == (3, 0)
    np.testing.assert_array_equal(read_verified(g["x"]), np.arange(4.0))
    written = dict(g.attrs)[GROUP_ATTR]
    shutil.copytree(tmp_path / "g.zarr", tmp_path / "h.zarr")
    assert record(zarr.open_group(str(tmp_path / "h.zarr"), mode="r+")) == written


def test_a_group_written_before_fingerprints_reads_unchecked(tmp_path):
    _observation(tmp_path / "obs")
    g = zarr.open_group(str(tmp_path / "obs" / "observation.zarr"), mode="r+")
    attrs = dict(g.attrs)
    attrs.pop(GROUP_ATTR)
    g.attrs.clear()
    g.attrs.update(attrs)
    for name in g.array_keys():
        a = dict(g[name].attrs)
        a.pop(CHUNKS_ATTR)
        g[name].attrs.clear()
        g[name].attrs.update(a)
    obs = load_observation(tmp_path / "obs")
    assert obs.fingerprint is None
    np.testing.assert_array_equal(obs.kappa_obs, KAPPA)


def test_hashes_taken_while_writing_equal_a_read_back(tmp_path):
    """write_arrays hashes each shard as its process writes it; reading everything back and
    hashing again (fingerprint.record) must give the same chunk hashes and fingerprint."""
    import jax

    from fli.store.fingerprint import record
    from fli.sim.sharding import field_sharding

    mesh = make_mesh((2, 2))
    x = jax.device_put(RNG.normal(size=(8, 6, 5)).astype(np.float32), field_sharding(mesh))
    arrays = {"x": x, "small": np.arange(7.0)}
    write_arrays(tmp_path / "g.zarr", arrays, {"note": 1})
    written = dict(zarr.open_group(str(tmp_path / "g.zarr"), mode="r").attrs)[GROUP_ATTR]
    shutil.copytree(tmp_path / "g.zarr", tmp_path / "h.zarr")
    assert record(zarr.open_group(str(tmp_path / "h.zarr"), mode="r+")) == written
    assert not (tmp_path / "g.zarr" / ".fli-hashes").exists()
