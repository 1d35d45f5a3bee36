"""File-system faults and typing mistakes, as a user meets them: one line, exit status 2,
nothing left behind.

The run directory under a regular file, an immutable parent (``chattr +i``, which binds root
too) and a full disk (a 64 KiB tmpfs) are made for real; the last two need root and are
skipped, saying so, where the machine does not allow them.
"""

import shutil
import subprocess

import pytest

from fli.cli.mock import main as mock_main
from tests.helpers.posterior import SMALL


def _one_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fli-mock: error:"), err
    return err[0]


def test_a_run_dir_under_a_regular_file_is_refused(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert mock_main([*SMALL, f"run_dir={tmp_path / 'afile' / 'run'}"]) == 2
    line = _one_line(capsys)
    assert f"{tmp_path / 'afile'} is a file, not a directory" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_an_unwritable_parent_is_refused(tmp_path, capsys):
    parent = tmp_path / "locked"
    parent.mkdir()
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(parent)]).returncode:
        pytest.skip("chattr +i is not available here (needs root on a file system with attributes)")
    try:
        assert mock_main([*SMALL, f"run_dir={parent / 'a' / 'run'}"]) == 2
        line = _one_line(capsys)
        assert f"nothing can be written in {parent}" in line
        assert not any(parent.iterdir())
    finally:
        subprocess.run(["chattr", "-i", str(parent)])


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                                                        capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield disk
    subprocess.run(["umount", str(disk)])


def test_a_full_disk_is_one_line_and_leaves_nothing_behind(small_disk, capsys):
    run = small_disk / "mock"  # the linear forward: the disk fills the same, the compile is shorter
    assert mock_main([*SMALL, "simulation.forward=linear", f"run_dir={run}"]) == 2
    line = _one_line(capsys)
    assert "No space left on device" in line and str(small_disk) in line
    assert not any(small_disk.iterdir())  # no half-written mock, no empty run directory


@pytest.mark.parametrize("override, hint", [
    ("inference.num_sample=3", "did you mean inference.num_samples"),
    ("inference.map.stepz=3", "did you mean inference.map.steps"),
    ("simulation.zzz=3", "the keys of simulation are: mesh, box"),
    ("experiment=tinyy", "did you mean experiment=tiny? the experiment options are cube, fine, laptop, tiny"),
    ("cosmology=planck", "the cosmology options are low_s8, planck18"),
    ("+seedd=1", "Key 'seedd' not in 'Config'; did you mean seed or sweep?"),
])
def test_a_mistyped_key_or_option_gets_a_suggestion(tmp_path, capsys, override, hint):
    assert mock_main([override, f"run_dir={tmp_path / 'run'}"]) == 2
    assert hint in _one_line(capsys)
    assert not (tmp_path / "run").exists()


def test_a_numerical_failure_is_one_line_naming_the_setting(tmp_path, capsys):
    """A body that fails numerically (as MUSE does on a singular J, or the MAP on a NaN loss)
    ends the command with status 2 and its one-line message, not a traceback."""
    from fli.cli.common import main_wrapper

    def body(cfg, resolved, run_dir, log):
        raise FloatingPointError("MUSE: the simulations' scores have a singular covariance J: raise "
                                 "inference.map.muse.n_sims")

    assert main_wrapper("mock", body, [*SMALL, f"run_dir={tmp_path / 'run'}"]) == 2
    line = _one_line(capsys)
    assert line == ("fli-mock: error: MUSE: the simulations' scores have a singular covariance J: raise "
                    "inference.map.muse.n_sims"), line
