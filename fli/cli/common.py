"""Shared start-up of every console script: Hydra's command line, validation first.

``fli-<cmd> [-m] [hydra overrides...]`` composes ``conf/config.yaml`` and validates every
job's config into :class:`fli.config.Config` with Hydra's compose API *before* anything is
written or compiled; bad input exits with status 2 and one line on stderr. Then it hands the
overrides to Hydra's own runner, so that Hydra's conventions hold: ``hydra.run.dir``,
``-m``/``--multirun`` sweeps into ``hydra.sweep.dir``/``hydra.sweep.subdir``, launcher plugins
(``hydra/launcher=submitit_local``, ``slurm``), and ``.hydra/`` in each run directory.

Run directory of a single run: ``run_dir=`` if given, else ``hydra.run.dir``, else
``outputs/<command>/<date>_<time>``; of sweep job i: ``hydra.sweep.dir``/``hydra.sweep.subdir``
(default ``multirun/<command>/<date>_<time>/<i>``). The directory is resolved once, on process 0,
and broadcast, so that every process of a ``jax.distributed`` run agrees on it (``${now:}``
is each process's own clock). Hydra never changes the working directory here
(``hydra.job.chdir`` stays false), so relative paths mean what the user typed.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from fli.cli.compose import compose_one, conf_dir, hydra_context, hydra_errors, one_line, register_resolvers
from fli.cli.rundir import Before, check_writable, drop_keys, fs_fault, quote, undo
from fli.config import Config, ConfigError, register_configs
from fli.store.files import agree

Body = Callable[[Config, dict, Path, logging.Logger], None]

USAGE = """usage: {prog} [--help] [--cfg [job|hydra|all]] [-m | --multirun] [key=value ...] [group=option ...]

Hydra overrides, e.g.  simulation.mesh=[32,32,64]  distributed.pdims=[1,2]  experiment=tiny
--cfg [job|hydra|all]  print the composed config (job: validated and resolved, the default) and exit
-m, --multirun         one run per combination of comma-separated values:  -m seed=0,1,2
observation            observation=DIR: a fli-observe observation or a fli-mock run (mock=DIR, the same key)
run directory          run_dir=DIR, else hydra.run.dir=DIR, else outputs/{cmd}/<date>_<time>
sweep directory        hydra.sweep.dir=DIR (default multirun/{cmd}/<date>_<time>), job i in
                       DIR/<hydra.sweep.subdir> (default i)
launchers (with -m)    hydra/launcher=basic (default: one job after another, in this process),
                       submitit_local, submitit_slurm, slurm (conf/hydra/launcher/slurm.yaml)
config groups (conf/): {groups}
"""

_BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
_BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
_PROCESS: dict = {}  # what this process was set up with (jax.distributed can start only once)


def setup_logging() -> logging.Logger:
    from fli.sim.sharding import get_logger  # noqa: PLC0415

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU" chatter
    return get_logger("fli")


# --------------------------------------------------------------------------- processes and devices


def _setup_process(cfg: Config) -> None:
    """jax.distributed and the compilation cache, once per process (a sweep's jobs share it)."""
    from fli.sim.sharding import init_distributed  # noqa: PLC0415

    d = cfg.distributed
    key = (d.coordinator, d.num_processes, d.process_id, d.local_device_count)
    if "distributed" not in _PROCESS:
        init_distributed(*key)
        _PROCESS["distributed"] = key
    elif _PROCESS["distributed"] != key:
        raise ConfigError(f"distributed.coordinator/num_processes/process_id/local_device_count {list(key)} "
                          f"differ from {list(_PROCESS['distributed'])}, which this process started with: jobs "
                          "that change them need a launcher that starts a process per job "
                          "(hydra/launcher=submitit_local)")
    setup_jax(cfg)


def setup_jax(cfg: Config) -> None:
    """float64 and the compilation cache, as the run's config asks (no jax.distributed: a
    single process calls this alone, e.g. fli-muse-worker)."""
    if cfg.simulation.dtype == "float64":
        import jax  # noqa: PLC0415

        # float64 fields need x64 on globally (jaxdecomp's partitioner ignores the scoped switch)
        jax.config.update("jax_enable_x64", True)
    if cfg.compilation_cache:
        import jax  # noqa: PLC0415

        # a repeated command (a resume, another seed) skips recompiling the same program
        jax.config.update("jax_compilation_cache_dir", str(Path(cfg.compilation_cache).expanduser()))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.0)


def _check_devices(cfg: Config) -> None:
    import jax  # noqa: PLC0415

    from fli.sim.sharding import n_devices_needed  # noqa: PLC0415

    d = cfg.distributed
    need, have = n_devices_needed(d.pdims), jax.device_count()
    if need > have:
        raise ConfigError(f"distributed.pdims {list(d.pdims)} needs {need} devices, found {have} "
                          f"(set distributed.local_device_count={need} on CPU)")


def _process_index() -> int:
    import jax  # noqa: PLC0415

    return jax.process_index()


# --------------------------------------------------------------------------- one job


def _job(command: str, body: Body, run_dir: str | None, in_process: bool, task_cfg: DictConfig
         ) -> tuple[int, str | None]:
    """Hydra's task function: validate, set up the process, run ``body``; returns (status, error).

    ``run_dir``: the single run's directory (agreed between processes); None in a sweep, where
    it is the job's Hydra output directory. In a sweep a refused job takes back what Hydra wrote.
    """
    from hydra.core.hydra_config import HydraConfig  # noqa: PLC0415

    from fli.config import to_config  # noqa: PLC0415

    prog = f"fli-{command}"
    hc = HydraConfig.get()
    out = Path(run_dir) if run_dir is not None else Path(hc.runtime.output_dir)
    before = None
    if run_dir is None:  # a sweep job: fresh unless it held more than Hydra's own files
        sweep = Path(hc.sweep.dir).absolute()
        others = [p for p in out.iterdir() if p.name != hc.output_subdir] if out.is_dir() else []
        parents = [p for p in out.absolute().parents if p != sweep and sweep in p.parents]
        before = Before(bool(others), None, parents)
    try:
        cfg = to_config(task_cfg)
        resolved = OmegaConf.to_container(task_cfg, resolve=True)
        log = setup_logging()
        _setup_process(cfg)
        _check_devices(cfg)
        import jax  # noqa: PLC0415

        log.info("%s: %d process(es), %d device(s) (%s), run directory %s", prog, jax.process_count(),
                 jax.device_count(), jax.devices()[0].platform, out)
        from fli.store.claim import holding  # noqa: PLC0415

        with holding(out, prog, log):  # one command at a time in a run directory
            body(cfg, resolved, out, log)
    except (ConfigError, FileNotFoundError, OSError, FloatingPointError) as e:
        # FloatingPointError: a numerical failure whose message says which setting to change
        # (a NaN loss, MUSE's singular J): one line, like a bad setting, not a traceback
        fault = not isinstance(e, (ConfigError, FileNotFoundError, FloatingPointError))
        msg = fs_fault(e, out) if fault else str(e)
        if msg is None:
            raise
        if not in_process:  # the submitter prints it too; this goes to the job's own log
            print(f"{prog}: error: {msg}", file=sys.stderr)
        if before is not None:
            undo(out, before, hc.output_subdir, _process_index() == 0, fs_fault=fault)
        return 2, msg, fault
    return 0, None, False


def _launch(command: str, overrides: list[str], task: Callable, multirun: bool):
    """Hydra's own runner (what ``@hydra.main`` does), on ``conf/`` with our argv."""
    from hydra import version  # noqa: PLC0415
    from hydra._internal.hydra import Hydra  # noqa: PLC0415
    from hydra._internal.utils import create_config_search_path  # noqa: PLC0415
    from hydra.core.global_hydra import GlobalHydra  # noqa: PLC0415

    version.setbase("1.3")
    register_configs()
    register_resolvers()
    GlobalHydra.instance().clear()
    hydra = Hydra.create_main_hydra2(task_name=command,
                                     config_search_path=create_config_search_path(str(conf_dir())))
    try:
        if multirun:
            return hydra.multirun(config_name="config", task_function=task,
                                  overrides=[*overrides, "hydra.mode=MULTIRUN"])
        return hydra.run(config_name="config", task_function=task, overrides=[*overrides, "hydra.mode=RUN"])
    except hydra_errors() as e:
        raise ConfigError(one_line(e)) from None
    finally:
        GlobalHydra.instance().clear()


# --------------------------------------------------------------------------- the command line


@dataclass
class _Args:
    overrides: list[str]
    multirun: bool = False
    show: str | None = None  # --cfg: job | hydra | all


def _parse(argv: list[str]) -> _Args:
    args, rest = _Args([]), list(argv)
    while rest:
        a = rest.pop(0)
        if a in ("-m", "--multirun"):
            args.multirun = True
        elif a in ("-r", "--run"):
            pass
        elif a in ("--cfg", "-c"):
            args.show = rest.pop(0) if rest and rest[0] in ("job", "hydra", "all") else "job"
        elif a.startswith("--cfg="):
            args.show = a.split("=", 1)[1]
            if args.show not in ("job", "hydra", "all"):
                raise ConfigError(f"--cfg takes job, hydra or all, got {args.show!r}")
        elif a.startswith("-"):
            raise ConfigError(f"unknown option {a}: give Hydra overrides key=value (see --help)")
        else:
            args.overrides.append(a)
    if args.multirun and args.show:
        raise ConfigError("--cfg and -m together: print one job's config without -m")
    return args


def _check_hydra(h: DictConfig, launcher: bool) -> None:
    if h.job.chdir:
        raise ConfigError("hydra.job.chdir must stay false: fli keeps the working directory, so that "
                          "relative paths (mock=, run_dir=) mean what you typed")
    if launcher:
        missing = sorted(OmegaConf.missing_keys(h.launcher))
        if missing:
            raise ConfigError(f"{missing[0]}: missing value (set {missing[0]}=...)")


def _show(what: str, resolved: dict, hnode: DictConfig) -> None:
    if what in ("job", "all"):
        print(OmegaConf.to_yaml(resolved))
    if what in ("hydra", "all"):  # as Hydra's --cfg hydra: unresolved (${now:} is each run's clock)
        print(OmegaConf.to_yaml({"hydra": OmegaConf.to_container(hnode, resolve=False)}))


def _plain(doc: str) -> str:
    """A command's module docstring as help text: its reST roles and literals as plain words."""
    doc = re.sub(r":\w+:`~?([^`]+)`", r"\1", doc)
    return doc.replace("``", "").strip()


def main_wrapper(command: str, body: Body, argv: list[str] | None = None, about: str | None = None) -> int:
    """Parse argv, validate, set up devices and the run directory, run ``body``; return exit code.

    ``body(cfg, resolved, run_dir, log)`` runs once per job: typed config, the resolved plain
    dict, the job's run directory (not yet created by the body; Hydra may have put ``.hydra/``
    in it) and the ``fli`` logger. A :class:`ConfigError` or ``FileNotFoundError`` from it is a
    refusal: status 2, one line on stderr, and what Hydra wrote for the run is taken back.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = f"fli-{command}"
    if "-h" in argv or "--help" in argv:
        groups = ", ".join(sorted(p.name for p in conf_dir().iterdir() if p.is_dir() and p.name != "hydra"))
        if about:  # what the command needs, writes, and an example: its module's docstring
            print(_plain(about) + "\n")
        print(USAGE.format(prog=prog, cmd=command, groups=groups))
        return 0
    try:
        args = _parse(observation_alias(argv))
        if args.multirun:
            return _sweep(command, body, args.overrides)
        return _single(command, body, args)
    except (ConfigError, FileNotFoundError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file-system fault outside the body (Hydra writing .hydra/, a full disk)
        msg = fs_fault(e, None)
        if msg is None:
            raise
        print(f"{prog}: error: {msg}", file=sys.stderr)
        return 2


def observation_alias(argv: list[str]) -> list[str]:
    """``observation=<dir>``, the name for a user's data, as the config's key ``mock=`` (which
    stays: a fli-mock run is an observation too). Both, naming different paths: ConfigError."""
    obs = [a.split("=", 1)[1] for a in argv if a.startswith("observation=")]
    if not obs:
        return argv
    mocks = [a.split("=", 1)[1] for a in argv if a.startswith("mock=")]
    if len(set(obs + mocks)) > 1:
        raise ConfigError(f"observation= and mock= name one key, the observation; given {', '.join(obs + mocks)}: "
                          f"give one path")
    return [("mock=" + a.split("=", 1)[1]) if a.startswith("observation=") else a for a in argv
            if not a.startswith("mock=")]


def with_defaults(argv: list[str], defaults: dict) -> list[str]:
    """``argv`` with a command's own ``defaults`` (``{key: value}``) put first for the keys it does
    not set: the command line, and a multirun's sweep of the key, win."""
    given = {a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a and not a.startswith("-")}
    return [f"{k}={v}" for k, v in defaults.items() if k not in given] + list(argv)


def verdict_main(command: str, run: Callable[..., dict], argv: list[str] | None, about: str | None) -> int:
    """:func:`main_wrapper` for a command whose run ends in a verdict: ``run(cfg, resolved, run_dir,
    log)`` returns a report with its ``exit_status``, and the command exits with the worst of its
    jobs' (0 pass, 3 warn, 4 fail), or with main_wrapper's own status for bad input or a crash."""
    statuses: list[int] = []

    def body(cfg: Config, resolved: dict, run_dir: Path, log: logging.Logger) -> None:
        statuses.append(run(cfg, resolved, run_dir, log)["exit_status"])

    code = main_wrapper(command, body, argv, about=about)
    return code if code or not statuses else max(statuses)


def _single(command: str, body: Body, args: _Args) -> int:
    with hydra_context(command):
        cfg, resolved, full = compose_one(args.overrides)
    hnode = full.hydra
    _check_hydra(hnode, launcher=False)
    if args.show:
        _show(args.show, resolved, hnode)
        return 0
    log = setup_logging()
    _setup_process(cfg)
    _check_devices(cfg)
    chosen = resolved["run_dir"] if resolved.get("run_dir") else str(hnode.run.dir)
    check_writable(Path(chosen), "run_dir" if resolved.get("run_dir") else "hydra.run.dir")
    if resolved.get("run_dir") and any(o.split("=", 1)[0] == "hydra.run.dir" for o in args.overrides):
        log.info("run_dir=%s wins over hydra.run.dir=%s", resolved["run_dir"], hnode.run.dir)
    # process 0 decides the directory (each process's ${now:} is its own clock) and what was there
    rank0 = _process_index() == 0
    mine = Before.of(Path(chosen), hnode.output_subdir)
    run_dir, sweep_dir, existed, parents = agree([chosen, str(hnode.sweep.dir), mine.existed,
                                                   [str(p) for p in mine.new_parents]])
    before = Before(existed, mine.hydra_files, [Path(p) for p in parents])
    overrides = drop_keys(args.overrides, ("hydra.run.dir", "hydra.sweep.dir"))
    overrides += [f"hydra.run.dir={quote(os.path.abspath(run_dir))}",
                  f"hydra.sweep.dir={quote(os.path.abspath(sweep_dir))}"]
    if not rank0:
        overrides.append("hydra.output_subdir=null")  # process 0 writes .hydra/
    task = functools.partial(_job, command, body, run_dir, True)
    code, err, fault = _launch(command, overrides, task, multirun=False).return_value
    if code:
        print(f"fli-{command}: error: {err}", file=sys.stderr)
        undo(Path(run_dir), before, hnode.output_subdir, rank0, fs_fault=fault)
    return code


def _parse_override(o: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: PLC0415

    try:
        return OverridesParser.create().parse_override(o)
    except hydra_errors() as e:
        raise ConfigError(one_line(e)) from None


def _sweep_jobs(hnode: DictConfig, overrides: list[str]) -> list[list[str]]:
    """Inside :func:`hydra_context`: the jobs of a basic sweep (each its list of overrides), in Hydra's order."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # noqa: PLC0415
    from hydra.core.global_hydra import GlobalHydra  # noqa: PLC0415
    from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: PLC0415

    params = OmegaConf.to_container(hnode.sweeper.params) if hnode.sweeper.get("params") else {}
    hydra_part = [o for o in overrides if _parse_override(o).is_hydra_override()]
    task = [o for o in overrides if o not in hydra_part]
    try:
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        parsed = parser.parse_overrides([f"{k}={v}" for k, v in params.items()] + task)
        batches = BasicSweeper.split_arguments(parsed, None)
    except hydra_errors() as e:
        raise ConfigError(one_line(e)) from None
    return [hydra_part + list(job) for batch in batches for job in batch]


def _sweep(command: str, body: Body, overrides: list[str]) -> int:
    prog = f"fli-{command}"
    non_sweep = [o for o in overrides if not _parse_override(o).is_sweep_override()]
    with hydra_context(command):
        from hydra import compose as hcompose  # noqa: PLC0415

        try:  # the sweep's own settings (hydra.sweep.*, the launcher): overrides that do not sweep
            hnode = hcompose(config_name="config", overrides=non_sweep, return_hydra_config=True).hydra
            _check_hydra(hnode, launcher=True)
            basic = hnode.sweeper._target_ == _BASIC_SWEEPER
            in_process = hnode.launcher._target_ == _BASIC_LAUNCHER
            sweep_dir = str(hnode.sweep.dir)
        except hydra_errors() as e:
            raise ConfigError(one_line(e)) from None
        check_writable(Path(sweep_dir), "hydra.sweep.dir")
        # every job validated before anything is written; another sweeper proposes its jobs as
        # it goes, so only what does not sweep can be checked here (each job checks itself)
        jobs = _sweep_jobs(hnode, overrides) if basic else [non_sweep]
        composed = [compose_one(job, f" (job #{i}: {' '.join(job)})") for i, job in enumerate(jobs)]
    for (_, resolved, _), job in zip(composed, jobs):
        if resolved.get("run_dir"):
            raise ConfigError(f"run_dir={resolved['run_dir']} is a single run's directory: with -m, job i "
                              "runs in hydra.sweep.dir/hydra.sweep.subdir (set those instead)")
    log = setup_logging()
    rank0 = True
    mine = Before.of(Path(sweep_dir), None)
    before = mine
    if in_process:  # the jobs run here, one after another: set up devices and check them first
        for i, (cfg, _, _) in enumerate(composed):
            try:
                _setup_process(cfg)
                _check_devices(cfg)
            except ConfigError as e:
                raise ConfigError(f"{e} (job #{i}: {' '.join(jobs[i])})") from None
        rank0 = _process_index() == 0
        sweep_dir, existed, parents = agree([sweep_dir, mine.existed, [str(p) for p in mine.new_parents]])
        before = Before(existed, None, [Path(p) for p in parents])
    log.info("%s: sweep of %s in %s (%s)", prog, f"{len(jobs)} job(s)" if basic else "the sweeper's jobs",
             sweep_dir, hnode.launcher._target_.rsplit(".", 1)[-1])
    extra = [f"hydra.sweep.dir={quote(os.path.abspath(sweep_dir))}",
             f"hydra.run.dir={quote(os.path.abspath(sweep_dir))}"]
    if not rank0:
        extra.append("hydra.output_subdir=null")
    task = functools.partial(_job, command, body, None, in_process)
    results = _launch(command, drop_keys(overrides, ("hydra.run.dir", "hydra.sweep.dir")) + extra, task,
                      multirun=True)
    returns = [r for batch in results for r in batch]
    failed = 0
    for i, r in enumerate(returns):
        code, err, _ = r.return_value
        if code:
            failed += 1
            print(f"{prog}: error: job #{i} ({r.hydra_cfg.hydra.runtime.output_dir}): {err}", file=sys.stderr)
    if failed and failed == len(returns) and not before.existed and rank0:
        # every job refused: take back the sweep directory Hydra made, if nothing else is in it
        sweep = Path(sweep_dir)
        if sweep.is_dir() and not [p for p in sweep.iterdir() if p.name != "multirun.yaml"]:
            (sweep / "multirun.yaml").unlink(missing_ok=True)
            undo(sweep, before, None, rank0)
    return 2 if failed else 0
