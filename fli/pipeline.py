"""``fli-pipeline``'s work: an observation to a diagnosed posterior, stage by stage, in one run directory.

Stages, each in a subdirectory that is an ordinary run directory of its own command (with its
manifest), so that any of them can be read, continued or re-run with that command:

* ``mock/``: fli-mock's observation, unless ``mock=<dir>`` names one (then that is read and the
  stage is skipped);
* ``map/``: fli-map's joint MAP, and MUSE where ``inference.map.estimator=muse``;
* ``sample/``: fli-sample's chains, started from ``map/`` (``init`` is the MAP's run);
* ``diagnose/``: fli-diagnose of ``sample/``: verdicts, figures, and report.html, which the
  pipeline writes again with each stage's cost.

Started again on the same ``run_dir``, a finished stage is passed over (a complete mock, a
``map.json``, a chain at its last draw) and a stopped one continues from its own checkpoints; the
pipeline refuses a run directory made with another model config, naming the key. The exit status
is the diagnosis's (0 pass, 3 warn, 4 fail). ``pipeline.json`` says what each stage cost: whether
this start made, resumed or passed it over, its seconds here, and the gradient evaluations its run
holds in all (the MAP's with MUSE's, the chains').
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
import time
from pathlib import Path

import yaml

from fli.config import Config, ConfigError

COMMAND = "fli-pipeline"
STAGES = ("mock", "map", "sample", "diagnose")
CONFIG_YAML = "config.yaml"
PIPELINE_JSON = "pipeline.json"
# what a pipeline started again may change: where and how it reports, budgets that extend a stage
MAY_CHANGE = ("run_dir", "progress", "compilation_cache", "distributed", "name", "diagnose",
              "inference.num_samples", "inference.map.steps", "inference.map.muse.iterations")


@contextlib.contextmanager
def _stage(run_dir: Path, name: str, log: logging.Logger, costs: dict):
    """Hold a stage's directory as its command would (one command at a time there), and log its time."""
    from fli.store.claim import holding  # noqa: PLC0415

    t0 = time.perf_counter()
    with holding(run_dir / name, f"{COMMAND} ({name})", log):
        log.info("%s: stage %s in %s", COMMAND, name, run_dir / name)
        yield run_dir / name
    costs[name] = {"status": "run", "seconds": time.perf_counter() - t0}
    log.info("%s: stage %s done in %.1f s", COMMAND, name, costs[name]["seconds"])


def _with(cfg: Config, resolved: dict, **keys) -> tuple[Config, dict]:
    """The config and the resolved dict of one stage: the same model, its own paths."""
    return dataclasses.replace(cfg, **keys), {**resolved, **keys}


def _check_resume(run_dir: Path, resolved: dict) -> None:
    from fli.infer.config_keys import check_resumable  # noqa: PLC0415

    saved = run_dir / CONFIG_YAML
    if saved.is_file():
        check_resumable(yaml.safe_load(saved.read_text()), resolved, MAY_CHANGE, where=f"run_dir {run_dir}")


def _observation(cfg: Config, resolved: dict, run_dir: Path, log: logging.Logger, costs: dict) -> Path:
    """The observation's path: ``mock=`` as given, or the mock stage's run (made, or found complete)."""
    from fli.mock import make_mock, write_mock  # noqa: PLC0415
    from fli.store.io import COMPLETE, MOCK_NAME  # noqa: PLC0415

    if cfg.mock is not None:
        log.info("%s: stage mock skipped: the observation is mock=%s", COMMAND, cfg.mock)
        costs["mock"] = {"status": f"given: mock={cfg.mock}", "seconds": 0.0}
        return Path(cfg.mock)
    stage = run_dir / "mock"
    if (stage / MOCK_NAME / COMPLETE).is_file():
        log.info("%s: stage mock already done (%s)", COMMAND, stage / MOCK_NAME)
        costs["mock"] = {"status": "done before", "seconds": 0.0}
        return stage
    with _stage(run_dir, "mock", log, costs) as d:
        if (d / MOCK_NAME).exists():  # a mock cut short: derived data, made again
            log.info("%s: %s was cut short (no %s): made again", COMMAND, d / MOCK_NAME, COMPLETE)
            shutil.rmtree(d / MOCK_NAME)
        mcfg, mres = _with(cfg, resolved, run_dir=str(d))
        write_mock(d, mcfg, mres, make_mock(mcfg, log), log)
    return stage


def run_pipeline(cfg: Config, resolved: dict, run_dir: Path, log: logging.Logger) -> dict:
    """Run (or continue) every stage into ``run_dir``; returns the diagnosis (its ``exit_status``)."""
    import jax  # noqa: PLC0415

    from fli.infer.diagnose import run_diagnose  # noqa: PLC0415
    from fli.infer.fit import fit_map  # noqa: PLC0415
    from fli.infer.fit.map import MAP_JSON  # noqa: PLC0415
    from fli.infer.muse import MUSE  # noqa: PLC0415
    from fli.infer.sample import run_chains  # noqa: PLC0415
    from fli.store.files import barrier, write_json, write_text  # noqa: PLC0415
    from fli.store.manifest import check_kind, write_manifest  # noqa: PLC0415

    run_dir = Path(run_dir)
    check_kind(run_dir, COMMAND)
    if cfg.init is not None:
        raise ConfigError(f"init={cfg.init}: fli-pipeline starts its chains from its own MAP stage; leave init "
                          f"unset (fli-sample init=... samples from another start)")
    if cfg.runs is not None or cfg.sweep is not None:
        raise ConfigError("runs= and sweep= are fli-diagnose's: fli-pipeline diagnoses its own chains")
    _check_resume(run_dir, resolved)
    if jax.process_index() == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(run_dir / CONFIG_YAML, yaml.safe_dump(resolved, sort_keys=False))
        write_manifest(run_dir, COMMAND, resolved)
    barrier("fli-pipeline-start")
    t0 = time.perf_counter()

    costs: dict[str, dict] = {}
    obs = str(Path(_observation(cfg, resolved, run_dir, log, costs)).absolute())
    if (run_dir / "map" / MAP_JSON).is_file():
        log.info("%s: stage map already done (%s)", COMMAND, run_dir / "map" / MAP_JSON)
        costs["map"] = {"status": "done before", "seconds": 0.0}
    else:
        with _stage(run_dir, "map", log, costs) as d:
            fit_map(*_with(cfg, resolved, run_dir=str(d), mock=obs), d, log, estimators={"muse": MUSE})
    map_dir = str((run_dir / "map").absolute())
    with _stage(run_dir, "sample", log, costs) as d:  # a finished chain says so and returns
        run_chains(*_with(cfg, resolved, run_dir=str(d), mock=obs, init=map_dir), d, log, command="fli-sample")
    with _stage(run_dir, "diagnose", log, costs) as d:  # one process reads the chains and writes the report
        if jax.process_index() == 0:
            dcfg, dres = _with(cfg, resolved, run_dir=str(d), runs=[str((run_dir / "sample").absolute())])
            report = run_diagnose(dcfg, dres, d, log)
        barrier("fli-pipeline-diagnosed")
    if jax.process_index() != 0:
        from fli.infer.diagnose.run import DIAGNOSTICS_JSON  # noqa: PLC0415

        report = json.loads((run_dir / "diagnose" / DIAGNOSTICS_JSON).read_text())
    seconds = time.perf_counter() - t0
    if jax.process_index() == 0:
        summary = stage_costs(run_dir, costs, seconds, report)
        write_json(run_dir / PIPELINE_JSON, summary, default=float)
        from fli.infer.diagnose.report import write_html  # noqa: PLC0415

        write_html({**report, "title": f"fli-pipeline {run_dir.name}", "stages": summary["stages"]}, run_dir / "diagnose")
    log.info("%s: %s in %.1f s: %s (exit status %d); report %s", COMMAND, run_dir, seconds,
             report["verdict"], report["exit_status"], run_dir / "diagnose" / "report.html")
    return report


def stage_costs(run_dir: Path, costs: dict, seconds: float, report: dict) -> dict:
    """pipeline.json: each stage's status and seconds in this start, and the gradient evaluations that
    its run directory records in all (map.json's, with its MUSE block's; nuts.json's)."""

    def read(path: Path) -> dict | None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    m, n = read(Path(run_dir) / "map" / "map.json"), read(Path(run_dir) / "sample" / "nuts.json")
    stages = {k: dict(v) for k, v in costs.items()}
    if "map" in stages:
        stages["map"]["gradient_evals"] = None if m is None else m["grad_evals"] + m.get("muse", {}).get("grad_evals", 0)
    if "sample" in stages:
        stages["sample"]["gradient_evals"] = None if n is None else n["gradient_evals"]
    return {"stages": stages, "seconds_this_start": seconds, "verdict": report["verdict"],
            "exit_status": report["exit_status"], "report": str(Path(run_dir) / "diagnose" / "report.html")}
