"""Runs that several inference test modules read and none modifies, made once per session: a
short fli-sample chain (``CHAIN``) of the small mock (tests/conftest.py). A test that resumes or
damages a run works on a copy."""

import pytest

from tests.helpers.posterior import CHAIN, SMALL


@pytest.fixture(scope="session")
def chain(small_mock, tmp_path_factory):
    """One NUTS chain of the small mock: 6 warm-up + 6 draws in chunks of 4, seed 3. It is run by
    fli-sample (inference.kernel=nuts: its default is MCLMC), and the tests that resume a copy run fli-nuts, the
    same run under its other name."""
    from fli.cli.sample import main as sample_main

    run = tmp_path_factory.mktemp("nuts") / "run"
    assert sample_main([*SMALL, *CHAIN, "inference.kernel=nuts", f"mock={small_mock}", f"run_dir={run}"]) == 0
    return run
