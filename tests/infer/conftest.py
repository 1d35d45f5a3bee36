"""Runs that several inference test modules read and none modifies, made once per session: a
short fli-nuts chain (``CHAIN``) of the small mock (tests/conftest.py). A test that resumes or
damages a run works on a copy."""

import pytest

from tests.helpers.posterior import CHAIN, SMALL


@pytest.fixture(scope="session")
def chain(small_mock, tmp_path_factory):
    """One fli-nuts chain of the small mock: 6 warm-up + 6 draws in chunks of 4, seed 3."""
    from fli.cli.nuts import main as nuts_main

    run = tmp_path_factory.mktemp("nuts") / "run"
    assert nuts_main([*SMALL, *CHAIN, f"mock={small_mock}", f"run_dir={run}"]) == 0
    return run
