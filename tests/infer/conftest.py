"""Runs that several inference test modules read and none modifies, made once per session: the
small mock (fli-mock of ``SMALL``) and a short fli-nuts chain of it (``CHAIN``). A test that
resumes or damages a run works on a copy."""

import pytest

from tests.helpers.posterior import CHAIN, SMALL


@pytest.fixture(scope="session")
def small_mock(tmp_path_factory):
    """fli-mock of the SMALL posterior's config (seed 0): read by fli-map, fli-nuts (one and
    several processes) and fli-diagnose tests."""
    from fli.cli.mock import main as mock_main

    run = tmp_path_factory.mktemp("mock") / "run"
    assert mock_main([*SMALL, f"run_dir={run}"]) == 0
    return run


@pytest.fixture(scope="session")
def chain(small_mock, tmp_path_factory):
    """One fli-nuts chain of the small mock: 6 warm-up + 6 draws in chunks of 4, seed 3."""
    from fli.cli.nuts import main as nuts_main

    run = tmp_path_factory.mktemp("nuts") / "run"
    assert nuts_main([*SMALL, *CHAIN, f"mock={small_mock}", f"run_dir={run}"]) == 0
    return run
