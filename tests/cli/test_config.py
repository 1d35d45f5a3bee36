"""Every config file and experiment composes and validates; bad input fails with its key named."""

from pathlib import Path

import pytest

from fli.cli.common import main_wrapper
from fli.cli.compose import compose, conf_dir
from fli.config import ConfigError

CONF = conf_dir()
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "experiment")


@pytest.mark.parametrize(
    "group,option",
    [(g, f.stem) for g in GROUPS for f in sorted((CONF / g).glob("*.yaml"))],
)
def test_every_group_option_composes(group, option):
    cfg, resolved = compose([f"{group}={option}"])
    assert resolved[group] is not None
    assert getattr(cfg, group) is not None


@pytest.mark.parametrize("exp", sorted(f.stem for f in (CONF / "experiment").glob("*.yaml")))
def test_every_experiment_composes(exp):
    cfg, _ = compose([f"experiment={exp}"])
    assert cfg.name == exp


@pytest.mark.parametrize(
    "override,needle",
    [
        ("simulation.nope=1", "simulation.nope"),
        ("simulation.halo=abc", "simulation.halo"),
        ("simulation.box=[0,1000,1000]", "simulation.box"),
        ("simulation.box=[-5,1000,1000]", "simulation.box"),
        ("cosmology.Omega_c=0", "cosmology.Omega_c"),
        ("cosmology.Omega_c=-0.2", "cosmology.Omega_c"),
        ("cosmology.sigma8=nan", "cosmology.sigma8"),
        ("distributed.pdims=[3,1]", "not divisible by distributed.pdims"),
        ("simulation.fft_backend=fftw", "simulation.fft_backend"),
        ("simulation.force_correction=-1", "simulation.force_correction"),
        ("simulation.assignment=ngp", "simulation.assignment"),
        ("experiment=nope", "experiment/nope"),
    ],
)
def test_bad_input_names_the_key(override, needle):
    with pytest.raises(ConfigError) as e:
        compose([override])
    msg = str(e.value)
    assert needle in msg
    assert "\n" not in msg  # one line


def test_cli_bad_input_exits_nonzero_and_writes_nothing(tmp_path, capsys):
    called = []
    run = tmp_path / "run"
    rc = main_wrapper("test", lambda *a: called.append(a), ["cosmology.Omega_c=-1", f"run_dir={run}"])
    assert rc == 2 and not called
    assert not run.exists() and list(tmp_path.iterdir()) == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cosmology.Omega_c" in err[0]


def test_cli_too_many_devices(tmp_path, capsys):
    rc = main_wrapper("test", lambda *a: None,
                      ["distributed.pdims=[4,4]", "experiment=tiny", f"run_dir={tmp_path / 'r'}"])
    assert rc == 2
    assert "needs 16 devices, found 8" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_config_tree_is_where_the_cli_looks():
    assert (Path(__file__).parents[2] / "conf" / "config.yaml").samefile(CONF / "config.yaml")
