"""The configuration reference (docs/config.md), generated from the schemas: every key of every
group with the value a run gets when the command line leaves it alone and what the schema's own
comments say of it. ``python -m fli.cli.reference`` writes the page; a test fails when it
drifts from the schemas or from ``conf/``."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import textwrap

from fli.config.inference import DiagnoseConfig, InferenceConfig, MapConfig, MuseConfig, ParamPrior, PriorConfig
from fli.config.schema import (Config, CosmologyConfig, DistributedConfig, LensingConfig, NzBinConfig,
                               SimulationConfig, SurveyConfig)

# (the key's path in the config, its schema), in the order of conf/config.yaml's groups
GROUPS = (("", Config), ("cosmology", CosmologyConfig), ("simulation", SimulationConfig),
          ("lensing", LensingConfig), ("survey", SurveyConfig), ("survey.bins[]", NzBinConfig),
          ("prior", PriorConfig), ("prior.params.<name>", ParamPrior), ("inference", InferenceConfig),
          ("inference.map", MapConfig), ("inference.map.muse", MuseConfig), ("distributed", DistributedConfig),
          ("diagnose", DiagnoseConfig))


def field_comments(cls) -> dict[str, str]:
    """Each field's comments in the schema's source: the comment lines just above it and the one
    at the end of its line, joined."""
    lines = inspect.getsource(cls).splitlines()
    body = ast.parse(textwrap.dedent("\n".join(lines))).body[0]
    out = {}
    for node in body.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        i = node.lineno - 1
        above = []
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            above.insert(0, lines[j].strip().lstrip("#").strip())
            j -= 1
        end = lines[node.end_lineno - 1]
        tail = _trailing_comment(end)
        out[node.target.id] = " ".join([*above, *([tail] if tail else [])])
    return out


def _trailing_comment(line: str) -> str:
    """The comment at the end of a line of code ('#' outside a string literal)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[i + 1:].strip()
    return ""


def _value(v) -> str:
    return "`" + json.dumps(v) + "`" if not isinstance(v, str) else f"`{v}`"


def _get(tree: dict, path: str):
    node = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


# fields that hold another section's schema: the section they point to
SUBSECTIONS = {(PriorConfig, "params"): "prior.params.<name>", (InferenceConfig, "map"): "inference.map",
               (MapConfig, "muse"): "inference.map.muse", (SurveyConfig, "bins"): "survey.bins[]"}
# where a list or mapping of a schema takes its default from
LISTED = {"survey.bins[]": "survey.bins", "prior.params.<name>": "prior.params"}


def render(defaults: dict) -> str:
    """docs/config.md from ``defaults``, the composed default config (``fli-mock --cfg job``'s)."""
    out = ["# Configuration reference",
           "",
           "Every key of fli's configuration, group by group, with the value a run gets when the command",
           "line leaves it alone (the composed `conf/`, as `fli-mock --cfg job` prints it) and what the",
           "schema says of it. Set a key on the command line (`lensing.npix=32`), choose a group's file",
           "(`experiment=laptop`), or print the composed config of any command with `--cfg job`. A key",
           "the schema lacks, or a value of the wrong type, is refused before anything runs.",
           "",
           "Generated from `fli/config/schema.py` and `fli/config/inference.py` by",
           "`python -m fli.cli.reference`; `tests/test_config_reference.py` fails when this page drifts.",
           ""]
    groups = {p for p, _ in GROUPS if p and "." not in p and "[" not in p}
    for path, cls in GROUPS:
        doc = " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())
        out += [f"## `{path}`" if path else "## Top-level keys", "", doc, ""]
        if path in LISTED:
            out += [f"Default `{LISTED[path]}`: {_value(_get(defaults, LISTED[path]))}", ""]
        out += ["| key | default | what |", "| --- | --- | --- |"]
        notes = field_comments(cls)
        base = None if path in LISTED else (_get(defaults, path) if path else defaults)
        for f in dataclasses.fields(cls):
            if cls is Config and f.name in groups:
                continue
            sub = SUBSECTIONS.get((cls, f.name))
            if sub:
                default = f"see `{sub}`"
            elif base is not None:
                default = _value(base.get(f.name))
            elif f.default is not dataclasses.MISSING:
                default = _value(f.default)
            else:
                default = "(required)"
            cell = lambda t: t.replace("|", "\\|")  # noqa: E731
            out.append(f"| `{f.name}` | {cell(default)} | {cell(notes.get(f.name, ''))} |")
        out.append("")
    return "\n".join(out)
