"""Checkpoints: bitwise round trips across device layouts, atomic commits, pruning, the optimisers'
and samplers' states. Which config changes a run may resume under is tests/infer/test_config_keys.py's.

Every comparison is bitwise (the bytes of each leaf), since resuming must continue exactly.
"""

import functools
import json
import logging
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fli.config import ConfigError
from fli.infer.checkpoint.store import (
    CheckpointError,
    CheckpointMismatch,
    all_steps,
    latest_step,
    read_meta,
    restore_checkpoint,
    save_checkpoint,
)
from fli.sim.sharding import field_sharding, make_mesh, replicated, white_noise
from tests.helpers.processes import ROOT, child_env, free_port, launch

SHAPE = (16, 8, 6)
WORKER = str(ROOT / "tests" / "helpers" / "ckpt_worker.py")


def bits(x) -> tuple:
    """dtype, shape and bytes of a leaf (typed keys by their key data): equal iff bitwise equal."""
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    a = np.asarray(x)
    return str(a.dtype), a.shape, a.tobytes()


def assert_tree_bitwise(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
        assert type(x) is type(y), jax.tree_util.keystr(path)
        assert bits(x) == bits(y), jax.tree_util.keystr(path)


@functools.cache
def _noise(seed: int) -> jax.Array:
    return white_noise(seed, SHAPE, make_mesh((2, 4)))


def field(seed: int, mesh) -> jax.Array:
    """white_noise ``[16, 8, 6]`` (drawn once per seed: each draw compiles) placed ``P('x','y')``
    on ``mesh``; white_noise is layout-independent, so this equals a draw on ``mesh``."""
    return jax.device_put(_noise(seed), field_sharding(mesh))


def make_state(mesh):
    """A state with every kind of leaf: a field ``P('x','y')``, a map sharded ``P(None, 'x')``, a
    replicated vector, numpy arrays and scalars, Python scalars, typed and raw keys, a None."""
    return {
        "field": field(1, mesh),
        "map": jax.device_put(jnp.arange(48.0, dtype=jnp.float32).reshape(3, 16), NamedSharding(mesh, P(None, "x"))),
        "theta": jax.device_put(jnp.array([0.3, 0.8], jnp.float32), replicated(mesh)),
        "hist": np.linspace(0.0, 1.0, 5),
        "count": np.int64(3),
        "n": 12,
        "lr": 0.5,
        "done": False,
        "key": jax.random.split(jax.random.key(7), 3),
        "raw_key": jax.random.PRNGKey(2),
        "nothing": None,
    }


def target_on(mesh):
    """What a resuming run asks for on ``mesh``: abstract shapes with shardings, and concrete
    placeholders where that is simpler."""
    return {
        "field": jax.ShapeDtypeStruct(SHAPE, jnp.float32, sharding=field_sharding(mesh)),
        "map": jax.ShapeDtypeStruct((3, 16), jnp.float32, sharding=NamedSharding(mesh, P(None, "x"))),
        "theta": jax.device_put(jnp.zeros(2, jnp.float32), replicated(mesh)),
        "hist": np.zeros(5),
        "count": np.int64(0),
        "n": 0,
        "lr": 0.0,
        "done": True,
        "key": jax.random.split(jax.random.key(0), 3),
        "raw_key": jax.random.PRNGKey(0),
        "nothing": None,
    }


@pytest.mark.parametrize("saved, restored", [((2, 4), (2, 4)), ((2, 4), (1, 1)), ((1, 8), (2, 2))])
def test_round_trip_bitwise_on_any_layout(tmp_path, saved, restored):
    state = make_state(make_mesh(saved))
    meta = {"config": {"pdims": (2, 4), "prior": {"sigma8": {"low": 0.5}}}, "wall_s": np.float64(1.5)}
    path = save_checkpoint(tmp_path, 3, state, meta)
    assert path == tmp_path / "3" and latest_step(tmp_path) == 3

    mesh = make_mesh(restored)
    got, got_meta = restore_checkpoint(tmp_path, None, target_on(mesh))
    assert_tree_bitwise(got, state)
    assert got["field"].sharding == field_sharding(mesh)
    assert got["theta"].sharding == replicated(mesh)
    assert got_meta == {"config": {"pdims": [2, 4], "prior": {"sigma8": {"low": 0.5}}}, "wall_s": 1.5}
    assert read_meta(tmp_path, 3) == got_meta


def test_a_relative_checkpoint_directory_round_trips(tmp_path, monkeypatch):
    """run_dir=outputs/map/tiny (the README's own example) gives a relative checkpoint
    directory; orbax takes only absolute paths ("Checkpoint path should be absolute"), so
    fli-map crashed at its first checkpoint. Saved and restored from the working directory."""
    monkeypatch.chdir(tmp_path)
    state = make_state(make_mesh((2, 4)))
    path = save_checkpoint("run/checkpoints", 1, state, {"step": 1})
    assert path == (tmp_path / "run" / "checkpoints" / "1") and latest_step("run/checkpoints") == 1
    got, meta = restore_checkpoint("run/checkpoints", None, target_on(make_mesh((2, 4))))
    assert_tree_bitwise(got, state)
    assert meta == {"step": 1} and read_meta("run/checkpoints", 1) == meta


def test_layout_of_a_complete_checkpoint(tmp_path):
    save_checkpoint(tmp_path, 0, {"a": jnp.ones(3)}, {"why": "layout"})
    step = tmp_path / "0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0"]
    assert (step / "commit_success.txt").is_file() and (step / "state").is_dir()
    sidecar = json.loads((step / "meta" / "metadata").read_text())
    assert sidecar["fli_checkpoint"] == 1 and sidecar["step"] == 0 and sidecar["meta"] == {"why": "layout"}
    # the checksum, computed here independently: uint32 words of 1.0f, plain and weighted sums mod 2^32
    words = np.ones(3, np.float32).view(np.uint32).astype(np.uint64)
    weights = (np.arange(3, dtype=np.uint64) * 2654435761 + 1) % 2**32
    checksum = f"u32:{int(words.sum() % 2**32)}:{int((words * weights % 2**32).sum() % 2**32)}"
    assert sidecar["leaves"] == [{"path": "['a']", "kind": "jax", "shape": [3], "dtype": "float32",
                                  "checksum": checksum}]


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_checkpoint_is_refused_in_one_line_naming_it(tmp_path, damage):
    mesh = make_mesh((2, 2))
    field = jax.device_put(jnp.asarray(np.random.default_rng(1).standard_normal((16, 8, 6)), jnp.float32),
                           field_sharding(mesh))
    save_checkpoint(tmp_path, 3, {"s": field, "n": 4}, {})
    files = sorted((p for p in (tmp_path / "3" / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = files[-1].read_bytes()  # the largest: the field's values
    if damage == "truncate":
        files[-1].write_bytes(data[: len(data) // 2])
    else:  # same size, other bytes: only a checksum can tell
        mid = len(data) // 2
        files[-1].write_bytes(data[:mid] + bytes(b ^ 0xFF for b in data[mid:mid + 16]) + data[mid + 16:])
    with pytest.raises(CheckpointError, match=r"checkpoint .*/3 is (damaged|unreadable)") as err:
        restore_checkpoint(tmp_path, 3, {"s": field, "n": 0})
    assert "\n" not in str(err.value)


def test_values_that_differ_from_the_saved_checksums_are_refused(tmp_path):
    save_checkpoint(tmp_path, 1, {"a": jnp.arange(6.0), "k": jax.random.key(0)}, {})
    f = tmp_path / "1" / "meta" / "metadata"
    side = json.loads(f.read_text())
    assert [r["checksum"][:4] for r in side["leaves"]] == ["u32:", "u32:"]  # the key's data too
    side["leaves"][0]["checksum"] = "u32:1:2"  # as if the stored values had changed after saving
    f.write_text(json.dumps(side))
    with pytest.raises(CheckpointError, match=r"is damaged: 1 leaf\(s\) differ .* \(first \['a'\]\)"):
        restore_checkpoint(tmp_path, 1, {"a": jnp.zeros(6), "k": jax.random.key(1)})


def test_latest_step_ignores_partial_checkpoints_and_save_cleans_them(tmp_path, caplog):
    state = {"x": jnp.arange(4.0)}
    for s in (1, 2):
        save_checkpoint(tmp_path, s, {"x": state["x"] + s}, {"s": s}, keep=10)
    # what orbax leaves when killed before its commit (all data written, not renamed) ...
    shutil.copytree(tmp_path / "2", tmp_path / "7.orbax-checkpoint-tmp")
    (tmp_path / "7.orbax-checkpoint-tmp" / "commit_success.txt").unlink()
    # ... in commit-file mode (no atomic rename): the final name without its marker ...
    shutil.copytree(tmp_path / "2", tmp_path / "8")
    (tmp_path / "8" / "commit_success.txt").unlink()
    # ... a committed directory without our JSON, a prune cut short, and foreign files
    shutil.copytree(tmp_path / "2", tmp_path / "9")
    shutil.rmtree(tmp_path / "9" / "meta")
    shutil.copytree(tmp_path / "1", tmp_path / "0.fli-deleting")
    (tmp_path / "notes").mkdir()

    assert all_steps(tmp_path) == [1, 2] and latest_step(tmp_path) == 2
    got, meta = restore_checkpoint(tmp_path, None, state)
    assert bits(got["x"]) == bits(state["x"] + 2) and meta == {"s": 2}
    for step, why in ((7, "7.orbax-checkpoint-tmp"), (8, "no commit marker"), (9, "no commit marker")):
        with pytest.raises(CheckpointError, match=why) as err:
            restore_checkpoint(tmp_path, step, state)
        assert str(tmp_path / str(step)) in str(err.value) and "complete steps" in str(err.value)

    with caplog.at_level(logging.INFO):  # orbax would warn about the stale tmp; we remove it first
        save_checkpoint(tmp_path, 7, {"x": state["x"] + 7}, {"s": 7}, keep=10)
    assert not [r for r in caplog.records if r.name == "absl"]
    assert not (tmp_path / "7.orbax-checkpoint-tmp").exists() and not (tmp_path / "0.fli-deleting").exists()
    assert all_steps(tmp_path) == [1, 2, 7]
    assert bits(restore_checkpoint(tmp_path, None, state)[0]["x"]) == bits(state["x"] + 7)


def test_save_killed_before_commit_is_never_latest(tmp_path):
    """SIGKILL a process that has written all of step 2 but not committed it."""
    env = child_env()
    proc = subprocess.Popen([sys.executable, WORKER, "hang", str(tmp_path)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(120, proc.kill)  # a worker stuck elsewhere ends the wait below
    watchdog.start()
    try:
        lines = []
        for line in proc.stdout:  # wait until the worker sits inside orbax's commit
            lines.append(line)
            if line.startswith("COMMITTING"):
                break
        assert lines and lines[-1].startswith("COMMITTING"), "".join(lines)[-3000:]
        proc.send_signal(signal.SIGKILL)
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait(timeout=60)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / "2.orbax-checkpoint-tmp" / "state").is_dir()  # its data were on disk
    assert latest_step(tmp_path) == 1 and all_steps(tmp_path) == [1]
    with pytest.raises(CheckpointError, match="interrupted"):
        read_meta(tmp_path, 2)
    from tests.helpers.ckpt_worker import reference_field, state_on  # noqa: PLC0415

    got, meta = restore_checkpoint(tmp_path, None, state_on(make_mesh((2, 2))))
    assert bits(got["field"]) == bits(reference_field()) and meta["pdims"] == [2, 2]


def test_keep_prunes_oldest_and_resave_replaces(tmp_path):
    for s in range(1, 5):
        save_checkpoint(tmp_path, s, {"x": jnp.full(3, float(s))}, {}, keep=2)
        assert all_steps(tmp_path) == list(range(max(1, s - 1), s + 1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3", "4"]
    save_checkpoint(tmp_path, 4, {"x": jnp.full(3, 40.0)}, {"again": True}, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["4"]
    got, meta = restore_checkpoint(tmp_path, 4, {"x": jnp.zeros(3)})
    assert np.asarray(got["x"]).tolist() == [40.0] * 3 and meta == {"again": True}
    # resuming from an earlier step abandons the later ones: latest_step is always the last save
    save_checkpoint(tmp_path, 6, {"x": jnp.full(3, 6.0)}, {}, keep=3)
    save_checkpoint(tmp_path, 5, {"x": jnp.full(3, 5.0)}, {}, keep=3)
    assert all_steps(tmp_path) == [4, 5] and latest_step(tmp_path) == 5
    with pytest.raises(ValueError, match="keep must be an integer >= 1, got 0"):
        save_checkpoint(tmp_path, 5, {"x": jnp.zeros(3)}, {}, keep=0)
    with pytest.raises(ValueError, match="step must be an integer >= 0, got -1"):
        save_checkpoint(tmp_path, -1, {"x": jnp.zeros(3)}, {})


def test_missing_and_corrupt_checkpoints_raise_one_line_errors(tmp_path):
    target = {"x": jnp.zeros(1000)}
    with pytest.raises(CheckpointError, match="no complete checkpoint in") as err:
        restore_checkpoint(tmp_path / "nowhere", None, target)
    assert isinstance(err.value, FileNotFoundError)
    save_checkpoint(tmp_path, 5, {"x": jnp.arange(1000.0)}, {})
    with pytest.raises(CheckpointError, match=r"checkpoint .*/6 is missing; complete steps in .*: \[5\]"):
        restore_checkpoint(tmp_path, 6, target)

    bad = tmp_path / "bad"
    shutil.copytree(tmp_path, bad)
    (bad / "5" / "meta" / "metadata").write_text("{not json")
    with pytest.raises(CheckpointError, match="is corrupt") as err:
        restore_checkpoint(bad, 5, target)
    assert str(bad / "5") in str(err.value) and "\n" not in str(err.value)

    broken = tmp_path / "broken"
    shutil.copytree(tmp_path, broken)
    for data in (broken / "5" / "state").rglob("d/*"):  # the array data files
        data.write_bytes(b"\0" * 7)
    with pytest.raises(CheckpointError, match="is unreadable") as err:
        restore_checkpoint(broken, 5, target)
    assert str(broken / "5") in str(err.value) and "\n" not in str(err.value)


def test_target_mismatch_names_the_leaf(tmp_path):
    state = {"field": jnp.ones((4, 4)), "key": jax.random.key(1), "n": 2}
    save_checkpoint(tmp_path, 1, state, {})
    cases = [
        ({**state, "field": jnp.ones((4, 5))}, r"leaf \['field'\]: saved float32\[4, 4\], target is float32\[4, 5\]"),
        ({**state, "field": jnp.ones((4, 4), jnp.int32)}, r"saved float32\[4, 4\], target is int32\[4, 4\]"),
        ({**state, "key": jnp.zeros(2, jnp.uint32)}, r"leaf \['key'\]: saved as a PRNG key, target is uint32"),
        ({**state, "extra": 1.0}, r"holds 3 leaves, the target has 4: leaf 0 is \['field'\] in the checkpoint, "
                                  r"\['extra'\] in the target"),
        ({"field": state["field"], "kee": state["key"], "n": 2}, r"leaf \['kee'\]: saved as \['key'\]"),
    ]
    for target, message in cases:
        with pytest.raises(CheckpointMismatch, match=message) as err:
            restore_checkpoint(tmp_path, 1, target)
        assert isinstance(err.value, ConfigError) and str(tmp_path / "1") in str(err.value)


def test_empty_state_round_trips(tmp_path):
    save_checkpoint(tmp_path, 0, {"opt": optax.EmptyState(), "none": None}, {"only": "meta"})
    got, meta = restore_checkpoint(tmp_path, 0, {"opt": optax.EmptyState(), "none": None})
    assert got == {"opt": optax.EmptyState(), "none": None} and meta == {"only": "meta"}


def test_zero_size_leaves_round_trip_on_their_sharding(tmp_path):
    """At fixed cosmology (``prior.sample=[]``) theta is a zero-size array, which orbax refuses
    to save: fli-map's first checkpoint stopped the run. Such leaves are kept by their record
    alone and come back as zero-size arrays of the saved dtype, on the target's sharding."""
    mesh = make_mesh((2, 4))
    state = {"theta": jax.device_put(jnp.zeros((0,), jnp.float32), replicated(mesh)), "field": field(1, mesh),
             "hist": np.zeros((0, 3))}
    save_checkpoint(tmp_path, 1, state, {})
    other = make_mesh((1, 2))  # read on another layout
    target = {"theta": jax.ShapeDtypeStruct((0,), jnp.float32, sharding=replicated(other)),
              "field": jax.ShapeDtypeStruct(SHAPE, jnp.float32, sharding=field_sharding(other)),
              "hist": np.ones((0, 3))}
    got, _ = restore_checkpoint(tmp_path, 1, target)
    assert_tree_bitwise(got, state)
    assert got["theta"].shape == (0,) and got["theta"].sharding == replicated(other)
    with pytest.raises(CheckpointMismatch, match=r"leaf \['theta'\]: saved float32\[0\], target is float32\[2\]"):
        restore_checkpoint(tmp_path, 1, target | {"theta": jnp.zeros(2, jnp.float32)})


# --------------------------------------------------------------------------- optimiser states


def _params(mesh):
    return {"s": field(4, mesh), "theta": jax.device_put(jnp.array([0.3, 0.8]), replicated(mesh))}


def _loss(p):
    target = jnp.linspace(-1.0, 1.0, SHAPE[2])
    return 0.5 * jnp.sum((p["s"] - target) ** 2) + jnp.sum((p["theta"] - 0.5) ** 2 * 10.0)


def test_adam_state_round_trips_and_continues_bitwise(tmp_path):
    schedule = optax.warmup_cosine_decay_schedule(0.0, 0.1, 2, 10)
    opt = optax.chain(optax.clip_by_global_norm(10.0), optax.scale_by_adam(), optax.scale_by_schedule(schedule),
                      optax.scale(-1.0))

    @jax.jit
    def step(params, state):
        updates, state = opt.update(jax.grad(_loss)(params), state, params)
        return optax.apply_updates(params, updates), state

    def run(params, state, n):
        for _ in range(n):
            params, state = step(params, state)
        return params, state

    mesh = make_mesh((2, 4))
    params = _params(mesh)
    params, state = run(params, opt.init(params), 3)
    save_checkpoint(tmp_path, 3, {"params": params, "opt": state, "step": 3}, {"optimizer": "adam"})
    ref = run(params, state, 3)

    fresh = _params(mesh)
    target = {"params": fresh, "opt": opt.init(fresh), "step": 0}
    got, _ = restore_checkpoint(tmp_path, 3, target)
    assert isinstance(got["opt"][1], optax.ScaleByAdamState) and isinstance(got["opt"][2], optax.ScaleByScheduleState)
    assert got["opt"][1].mu["s"].sharding == field_sharding(mesh) and got["step"] == 3
    assert_tree_bitwise(got["opt"], state)
    assert_tree_bitwise(run(got["params"], got["opt"], 3), ref)  # continued == uninterrupted

    other = make_mesh((1, 1))  # and on another layout, the same state
    fresh = _params(other)
    got, _ = restore_checkpoint(tmp_path, 3, {"params": fresh, "opt": opt.init(fresh), "step": 0})
    assert got["opt"][1].nu["s"].sharding == field_sharding(other)
    assert_tree_bitwise(got, {"params": params, "opt": state, "step": 3})


def test_lbfgs_state_round_trips_on_another_layout(tmp_path):
    opt = optax.lbfgs(memory_size=3)
    value_and_grad = optax.value_and_grad_from_state(_loss)

    @jax.jit
    def step(params, state):
        value, grad = value_and_grad(params, state=state)
        updates, state = opt.update(grad, state, params, value=value, grad=grad, value_fn=_loss)
        return optax.apply_updates(params, updates), state

    params = _params(make_mesh((2, 4)))
    state = opt.init(params)
    for _ in range(2):
        params, state = step(params, state)
    assert int(state[0].count) == 2
    save_checkpoint(tmp_path, 2, {"params": params, "opt": state}, {})

    mesh = make_mesh((2, 2))
    fresh = _params(mesh)
    got, _ = restore_checkpoint(tmp_path, 2, {"params": fresh, "opt": opt.init(fresh)})
    assert type(got["opt"][0]).__name__ == "ScaleByLBFGSState"
    assert got["params"]["s"].sharding == field_sharding(mesh)
    assert_tree_bitwise(got, {"params": params, "opt": state})


def test_numpyro_hmc_state_round_trips(tmp_path):
    from numpyro.infer.hmc import HMCState  # noqa: PLC0415
    from numpyro.infer.hmc_util import HMCAdaptState  # noqa: PLC0415

    def hmc_state(mesh, scale):
        """A NUTS state over a sharded field and a replicated vector (None momentum, raw keys)."""
        f32, i32, site = jnp.float32, jnp.int32, ("s", "theta")
        z = {"s": field(1, mesh) * scale, "theta": jax.device_put(jnp.array([0.1, 0.2]) * scale, replicated(mesh))}
        adapt = HMCAdaptState(
            step_size=f32(0.1 * scale), inverse_mass_matrix={site: jnp.ones(3) * scale},
            mass_matrix_sqrt={site: jnp.ones(3)}, mass_matrix_sqrt_inv={site: jnp.ones(3)},
            ss_state=(f32(scale), f32(0.0), f32(1.0), i32(4)), mm_state=(jnp.zeros(3), jnp.zeros(3), 0),
            window_idx=i32(2), rng_key=jax.random.PRNGKey(9))
        return HMCState(
            i=i32(17), z=z, z_grad=jax.tree.map(lambda x: -x, z), potential_energy=f32(3.5 * scale),
            energy=f32(4.5), r=None, trajectory_length=f32(0.8), num_steps=i32(7), accept_prob=f32(0.7),
            mean_accept_prob=f32(0.65), diverging=jnp.bool_(False), adapt_state=adapt,
            rng_key=jax.random.PRNGKey(3))

    saved = hmc_state(make_mesh((2, 4)), 1.5)
    save_checkpoint(tmp_path, 17, saved, {"sampler": "nuts"})
    got, _ = restore_checkpoint(tmp_path, 17, hmc_state(make_mesh((1, 1)), 0.0))
    assert isinstance(got, HMCState) and isinstance(got.adapt_state, HMCAdaptState) and got.r is None
    assert_tree_bitwise(got, saved)


# --------------------------------------------------------------------------- several processes


@pytest.mark.multiprocess
def test_two_process_save_restores_on_other_layouts(tmp_path):
    from tests.helpers.ckpt_worker import reference_field, state_on  # noqa: PLC0415

    port, ckpt = free_port(), tmp_path / "ckpt"
    t0 = time.time()
    res = launch(lambda i: [sys.executable, WORKER, "save", str(port), "2", str(i), str(ckpt)], timeout=300)
    for rc, text in res:
        assert rc == 0, text[-3000:]
        assert "2 processes, 4 devices, latest 2, restored on (4, 1), ok" in text
    assert time.time() - t0 < 120
    assert sorted(p.name for p in ckpt.iterdir()) == ["2"]  # keep=1 pruned step 1
    assert sorted(p.name for p in (ckpt / "2" / "state").glob("ocdbt.process_*")) == ["ocdbt.process_0",
                                                                                        "ocdbt.process_1"]
    for pdims in ((2, 4), (1, 1)):
        mesh = make_mesh(pdims)
        got, meta = restore_checkpoint(ckpt, None, state_on(mesh))
        assert bits(got["field"]) == bits(reference_field()) and got["field"].sharding == field_sharding(mesh)
        assert float(got["scalar"]) == 0.625 and got["count"] == 7 and meta == {"pdims": [2, 2], "pid_saving": 0}
        assert bits(got["key"]) == bits(jax.random.key(5))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_, np.uint8])
def test_a_checksum_is_the_same_sharded_replicated_and_on_the_host(dtype):
    """A leaf restored onto another placement (a global array, a process-local one, numpy)
    must meet the same checksum: the device sums and the host sums agree."""
    from fli.infer.checkpoint.store import checksums

    bits = np.random.default_rng(2).integers(0, 2, (8, 8, 4))
    a = bits.astype(dtype) if dtype == np.bool_ else (bits * 37 - 11).astype(dtype)
    mesh = make_mesh((2, 2))
    sharded = jax.device_put(a, field_sharding(mesh))
    assert len(set(checksums([sharded, jax.device_put(a, replicated(mesh)), a]))) == 1
    assert checksums([a])[0] != checksums([a[::-1]])[0]  # the order of the values counts
