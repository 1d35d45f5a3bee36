"""Test settings: 8 virtual CPU devices (set before jax is imported), strict JAX checks."""

import os

from tests.helpers.xla import FLAGS as _XLA_FLAGS  # (imports no jax)

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" {_XLA_FLAGS} --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "allow")
# JAX's persistent compilation cache: tests that build the same small posterior (and the slow
# tests that CI runs after the default ones) reuse compiled programs instead of recompiling
_CACHE = os.environ.get("FLI_TEST_JAX_CACHE", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "jax"))
jax.config.update("jax_compilation_cache_dir", os.path.abspath(_CACHE))
# ... and every fli command the tests run, in this process or in another, uses the same cache
# (conf/config.yaml's compilation_cache reads FLI_COMPILATION_CACHE), not the user's
# ~/.cache/fli/jax: a fresh clone's CI starts cold, and nothing outside the checkout is written
os.environ["FLI_COMPILATION_CACHE"] = os.path.abspath(_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


@pytest.fixture(scope="session")
def n_devices() -> int:
    return jax.device_count()


@pytest.fixture(scope="session")
def small_mock(tmp_path_factory):
    """fli-mock of the SMALL posterior's config (seed 0), through the command's entry point: read
    by the fli-mock tests and by fli-map, fli-nuts (one and several processes) and fli-diagnose
    tests. No test modifies it; one that damages a mock works on a copy."""
    from fli.cli.mock import main as mock_main
    from tests.helpers.posterior import SMALL

    run = tmp_path_factory.mktemp("mock") / "run"
    assert mock_main([*SMALL, f"run_dir={run}"]) == 0
    return run


# --------------------------------------------------------------------------- the time budget
# CI (.ci/run) runs the default set, then the slow set, on 2 cores: 7 and 40 minutes in all
# (docs/contributing.md, "Tests"). Every slow test states its measured cost in its mark,
# ``@pytest.mark.slow(seconds=40)``, set-up of the fixtures it is first to need included;
# the session's summary puts the measured times beside the stated ones.
DEFAULT_BUDGET_S, CI_BUDGET_S = 7 * 60, 40 * 60
_durations: dict[str, float] = {}
_stated: dict[str, float] = {}
_started: list[float] = []


def pytest_sessionstart(session):
    import time

    _started.append(time.time())


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        mark = item.get_closest_marker("slow")
        if mark is not None and not isinstance(mark.kwargs.get("seconds"), (int, float)):
            raise pytest.UsageError(f"{item.nodeid}: a slow test states its measured cost on 2 cores, "
                                    "e.g. @pytest.mark.slow(seconds=40)")
        if mark is not None:  # user_properties travel with the reports (also from pytest-xdist's workers)
            item.user_properties.append(("slow_seconds", float(mark.kwargs["seconds"])))
    yield  # the other plugins' hooks, -m's deselection among them
    _longest_files_first(items)


def _longest_files_first(items) -> None:
    """Order the files by their slow tests' stated seconds, longest first, then by their number of
    tests (what pytest-xdist's own reordering does, so the default set's order is unchanged); a
    file's tests keep their order. pyproject's ``--no-loadscope-reorder`` makes the workers take
    whole files in this order, so that the last file a worker takes is a short one: with the
    files in pytest-xdist's order (by number of tests) a 300-s file could start last while the
    other worker sat idle."""
    cost: dict[str, list[float]] = {}
    for item in items:
        c = cost.setdefault(item.nodeid.split("::")[0], [0.0, 0])
        mark = item.get_closest_marker("slow")
        c[0] += float(mark.kwargs["seconds"]) if mark is not None else 0.0
        c[1] += 1
    items.sort(key=lambda item: tuple(-x for x in cost[item.nodeid.split("::")[0]]))


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    for key, value in report.user_properties:
        if key == "slow_seconds":
            _stated[report.nodeid] = value


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import time

    slow = {n: (s, _durations[n]) for n, s in _stated.items() if n in _durations}
    total = sum(_durations.values())
    if not _durations:
        return
    # wall time is what the budget counts; with pytest-xdist's workers (pyproject's addopts) the
    # tests' own times add up to more than it
    wall = time.time() - _started[0] if _started else total
    _write_durations(config, "slow" if slow else "default", wall)
    _longest_files(terminalreporter)
    if not slow:
        terminalreporter.write_line(f"time budget: {len(_durations)} tests in {wall:.0f} s of wall time (their own "
                                    f"times add up to {total:.0f} s); the default set's budget is {DEFAULT_BUDGET_S} s "
                                    "on 2 cores")
        return
    stated, measured = sum(s for s, _ in slow.values()), sum(m for _, m in slow.values())
    terminalreporter.write_line(f"time budget: {len(slow)} slow tests stated {stated:.0f} s and took {measured:.0f} s, "
                                f"{wall:.0f} s of wall time; CI's budget is {CI_BUDGET_S} s on 2 cores for both sets, "
                                "install included")
    over = sorted(((m - s, n, s, m) for n, (s, m) in slow.items() if m > 2 * s + 20), reverse=True)
    for _, name, s, m in over:
        terminalreporter.write_line(f"  over its stated cost: {name} stated {s:.0f} s, took {m:.0f} s")


def _longest_files(terminalreporter, n: int = 8) -> None:
    """The files whose tests took longest (set-up included), what to cut first when a set nears
    its budget."""
    by_file: dict[str, list[float]] = {}
    for nodeid, sec in _durations.items():
        c = by_file.setdefault(nodeid.split("::")[0], [0.0, 0])
        c[0] += sec
        c[1] += 1
    top = sorted(by_file.items(), key=lambda kv: -kv[1][0])[:n]
    terminalreporter.write_line("longest files: " + ", ".join(f"{f} {s:.0f} s ({k})" for f, (s, k) in top))


def _write_durations(config, which: str, wall: float) -> None:
    """Every test's measured (and, if slow, stated) seconds, in ``.pytest_cache/durations-<set>.json``,
    so that a CI run's times can be read after it (a fresh clone keeps its checkout)."""
    import json

    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller writes the whole set's
        return
    path = config.rootpath / ".pytest_cache" / f"durations-{which}.json"
    path.parent.mkdir(exist_ok=True)
    rec = {"wall_s": wall, "tests": {n: {"s": round(d, 2), **({"stated_s": _stated[n]} if n in _stated else {})}
                                     for n, d in sorted(_durations.items(), key=lambda kv: -kv[1])}}
    path.write_text(json.dumps(rec, indent=1))
