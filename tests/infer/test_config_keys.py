"""Which config changes a run may be resumed under (fli.infer.config_keys.check_resumable): the
allowed keys, keys a kernel never reads, keys that count only where they act, and keys added
since a run was made."""

import json

import pytest

from fli.config import ConfigError
from fli.infer.config_keys import check_resumable

SAVED = {
    "run_dir": "outputs/x",
    "progress": True,
    "distributed": {"coordinator": None, "num_processes": None},
    "inference": {"map_steps": 100, "lr": 0.01},
    "prior": {"params": {"sigma8": {"low": 0.5, "high": 1.2}}},
    "survey": {"bins": [{"z0": 0.4}, {"z0": 0.8}]},
    "simulation": {"pdims": [2, 4], "fast": False},
}
ALLOWED = ("inference.map_steps", "run_dir", "progress", "distributed")


def changed(**dotted):
    cfg = json.loads(json.dumps(SAVED))
    for key, value in dotted.items():
        *head, last = key.split("__")
        node = cfg
        for k in head:
            node = node[int(k)] if isinstance(node, list) else node[k]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return cfg


def test_check_resumable_accepts_allowed_changes():
    check_resumable(SAVED, json.loads(json.dumps(SAVED)), ALLOWED)
    check_resumable(SAVED, changed(inference__map_steps=500, run_dir="outputs/y", progress=False,
                                   distributed__coordinator="h:1", distributed__new=3), ALLOWED)
    check_resumable(SAVED, {**SAVED, "simulation": {"pdims": (2, 4), "fast": False}}, ALLOWED)  # tuple = list
    check_resumable(SAVED, changed(inference__lr=0.01 + 0.0), ALLOWED)
    check_resumable({"a": 1, "b": float("nan")}, {"a": 1.0, "b": float("nan")}, ())  # int 1 == float 1.0


def test_check_resumable_refuses_other_changes_naming_the_key():
    with pytest.raises(ConfigError) as err:
        check_resumable(SAVED, changed(prior__params__sigma8__high=1.0), ALLOWED)
    assert str(err.value) == ("run_dir outputs/x was made with prior.params.sigma8.high = 1.2; this run "
                              "has 1.0: use another run_dir or the same config")
    cases = [
        (changed(survey__bins__1__z0=0.9), "survey.bins[1].z0 = 0.8; this run has 0.9"),
        (changed(inference__extra=1), "was made without inference.extra; this run has inference.extra = 1"),
        (changed(inference__lr=KeyError), "was made with inference.lr = 0.01; this run has no inference.lr"),
        (changed(simulation__fast=0), "simulation.fast = false; this run has 0"),  # False is not 0
        (changed(simulation__pdims=[1, 1]), "simulation.pdims[0] = 2; this run has 1"),
        (changed(survey__bins=[{"z0": 0.4}]), 'survey.bins = [{"z0": 0.4}, {"z0": 0.8}]; this run has [{"z0": 0.4}]'),
        (changed(inference__lr="0.01"), 'inference.lr = 0.01; this run has "0.01"'),
        (changed(inference__map_steps="100"), 'inference.map_steps'),  # allowed: no error expected
    ]
    for current, message in cases[:-1]:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
            check_resumable(SAVED, current, ALLOWED)
        assert "\n" not in str(err.value) and str(err.value).endswith("use another run_dir or the same config")
    check_resumable(SAVED, cases[-1][0], ALLOWED)
    # a prefix covers its sub-keys only, not keys that merely start with the same letters
    with pytest.raises(ConfigError, match="inference.map_steps_max"):
        check_resumable(SAVED, changed(inference__map_steps_max=3), ALLOWED)
    with pytest.raises(ConfigError, match="^the checkpoint was made with a = 1"):
        check_resumable({"a": 1}, {"a": 2}, ())


def test_keys_a_kernel_never_reads_may_change_on_resume():
    """Adjusted MCLMC reads neither MCLMC's energy-error target nor its L rule: a run made under
    the old default of the first resumes under the new one; unadjusted MCLMC, which reads it,
    does not; NUTS ignores both."""
    from fli.infer.config_keys import SAMPLING_MAY_CHANGE, unread_by

    assert unread_by("mclmc") == ()
    assert set(unread_by("adjusted_mclmc")) == set(unread_by("nuts")) == {"inference.mclmc_energy_error",
                                                                           "inference.mclmc_length"}
    saved = {"run_dir": "r", "inference": {"kernel": "adjusted_mclmc", "mclmc_energy_error": 5e-4}}
    now = {"run_dir": "r", "inference": {"kernel": "adjusted_mclmc", "mclmc_energy_error": 1e-4}}
    check_resumable(saved, now, SAMPLING_MAY_CHANGE)
    saved["inference"]["kernel"] = now["inference"]["kernel"] = "mclmc"
    with pytest.raises(ConfigError, match="inference.mclmc_energy_error = 0.0005"):
        check_resumable(saved, now, SAMPLING_MAY_CHANGE)
    # a kernel that reads it against one that does not: the kernel differs, and so does the key
    saved["inference"]["kernel"] = "adjusted_mclmc"
    with pytest.raises(ConfigError, match="inference.kernel"):
        check_resumable(saved, now, SAMPLING_MAY_CHANGE)


def test_particle_plane_keys_count_only_where_the_particle_planes_are_painted():
    """A tiny run made before the particle planes existed (no lensing.planes, subparticles or
    pgd_* keys) resumes under today's tiny config (mesh planes, the default's subparticles = 2):
    mesh planes read none of them. Under particle planes on both sides they count; the shift's
    shape counts only where the shift is on."""
    old = {"run_dir": "r", "lensing": {"npix": 16}}
    tiny = {"run_dir": "r", "lensing": {"npix": 16, "planes": "mesh", "subparticles": 2, "pgd_alpha": 0.0,
                                        "pgd_mu": 0.0, "pgd_kl": 0.4, "pgd_ks": 1.0}}
    check_resumable(old, tiny, ())
    part = json.loads(json.dumps(tiny))
    part["lensing"].update(planes="particles", pgd_alpha=1.0)
    with pytest.raises(ConfigError, match="lensing.planes"):
        check_resumable(old, part, ())
    other = json.loads(json.dumps(part))
    other["lensing"]["subparticles"] = 3
    with pytest.raises(ConfigError, match="lensing.subparticles = 2; this run has 3"):
        check_resumable(part, other, ())
    off, off2 = json.loads(json.dumps(part)), json.loads(json.dumps(part))
    off["lensing"]["pgd_alpha"] = off2["lensing"]["pgd_alpha"] = 0.0
    off2["lensing"]["pgd_kl"] = 0.9
    check_resumable(off, off2, ())
    part2 = json.loads(json.dumps(part))
    part2["lensing"]["pgd_kl"] = 0.9
    with pytest.raises(ConfigError, match="lensing.pgd_kl"):
        check_resumable(part, part2, ())


def test_the_mass_assignment_counts_only_where_particles_are_painted():
    """simulation.assignment (added with TSC): a run saved without it is CIC's; it is a model key
    of the PM forward, and the linear forward, which paints nothing, never reads it."""
    old = {"run_dir": "r", "simulation": {"forward": "pm"}}
    cic = {"run_dir": "r", "simulation": {"forward": "pm", "assignment": "cic"}}
    check_resumable(old, cic, ())
    tsc = json.loads(json.dumps(cic))
    tsc["simulation"]["assignment"] = "tsc"
    with pytest.raises(ConfigError, match="simulation.assignment"):
        check_resumable(old, tsc, ())
    lin_old, lin_tsc = json.loads(json.dumps(old)), json.loads(json.dumps(tsc))
    lin_old["simulation"]["forward"] = lin_tsc["simulation"]["forward"] = "linear"
    check_resumable(lin_old, lin_tsc, ())


def test_a_key_added_since_a_run_resumes_only_at_the_value_that_does_what_the_run_did():
    """``inference.mclmc_energy_error`` came after runs were made: a run saved without it
    resumes under its default (5e-4, what MCLMC did before the key), not under another value,
    and a run saved with it is compared as any key."""
    from fli.infer.config_keys import ADDED

    saved = json.loads(json.dumps(SAVED))
    now = json.loads(json.dumps(SAVED))
    now["inference"]["mclmc_energy_error"] = ADDED["inference.mclmc_energy_error"]
    check_resumable(saved, now, ALLOWED)
    now["inference"]["mclmc_energy_error"] = 1e-4
    with pytest.raises(ConfigError, match=r"was made without inference.mclmc_energy_error, as "
                                          r"inference.mclmc_energy_error=0.0005 does; this run has .* so add "
                                          r"inference.mclmc_energy_error=0.0005 to resume it"):
        check_resumable(saved, now, ALLOWED)
    saved["inference"]["mclmc_energy_error"] = 2e-4
    with pytest.raises(ConfigError, match="inference.mclmc_energy_error = 0.0002; this run has 0.0001"):
        check_resumable(saved, now, ALLOWED)
