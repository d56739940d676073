"""The schema of the policy data FinOps edit (`policies/data/*.yaml`), and its checks.

The shipped policies read three data files: `budgets`, `priorities` and `placement`.
Rego reads them with `object.get(..., default)`, so a typo is not an error there: it
is a default. `monthy_usd: 100` reads as "no budget", `kind: hardd` as "not hard"
(a team at 500 % keeps `may_scale_up: true`), `monthly_usd: "5k"` as "not a number,
so no budget". The models below say what each file may hold; they are exported as
JSON Schema into `docs/schemas/` (`policy-data-<name>.v1.json`) and every data file
is checked against its schema before a bundle is built, by `autoscaler policy
check|test|eval` and by the service at start and on every reload.

A policy directory may bring schemas for its own data files: `data/<name>.schema.json`
(any JSON Schema draft; 2020-12 when `$schema` is not set) is applied to
`data/<name>.yaml|.yml|.json`. Next to a shipped file it is applied on top of the
shipped schema. A data file that is neither shipped nor has a schema is accepted
as it is.

Every problem is one line: the file, the line of the key, the key path and what was
expected (`data/budgets.yaml:24: teams.vision.monthy_usd: unknown key (did you mean
monthly_usd?)`).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from autoscaler.policy.problems import Problem

# A user's schema for its data file `data/<name>.yaml` is `data/<name>.schema.json`.
SCHEMA_SUFFIX = ".schema.json"


def _no_default(schema: dict[str, Any]) -> None:
    # An optional key that may not be null: leave it out, never write `null`.
    schema.pop("default", None)


def _optional(description: str) -> Any:
    return Field(None, description=description, json_schema_extra=_no_default)


Usd = Annotated[float, Field(gt=0)]
Gpus = Annotated[int, Field(ge=0)]
Names = list[str]


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# ---------------------------------------------------------------- budgets.yaml


class BudgetDefault(_Data):
    """The budget of any team not listed under `teams`."""

    monthly_usd: Usd | None = Field(None, description="USD per calendar month (UTC); null = no budget (unlimited).")
    kind: Literal["hard", "soft"] = Field(
        "soft", description="hard: freeze at the forecast, drain at the limit; soft: alerts only."
    )


class TeamBudget(_Data):
    """One team's budget. `monthly_usd` must be written out: null says "no budget"."""

    monthly_usd: Usd | None = Field(description="USD per calendar month (UTC); null = no budget (unlimited).")
    kind: Literal["hard", "soft"] = Field(
        "soft", description="hard: freeze at the forecast, drain at the limit; soft: alerts only."
    )


class BudgetsData(_Data):
    """`data/budgets.yaml`: monthly budgets in US dollars, per team (read by budgets.rego)."""

    thresholds_pct: list[Annotated[float, Field(gt=0)]] = Field(
        default_factory=lambda: [50.0, 80.0, 100.0],
        description="Alerts fire at these percentages of the budget (critical from 100, warning from 80).",
    )
    default: BudgetDefault = Field(default_factory=BudgetDefault)
    teams: dict[str, TeamBudget] = Field(default_factory=dict, description="Budgets by team name.")


# ---------------------------------------------------------------- priorities.yaml


class Tier(_Data):
    tier: int = Field(ge=0, description="Higher tiers are served first when GPUs are short.")
    weight: float = Field(1.0, gt=0, description="Share of capacity within the tier.")


class Quota(_Data):
    """GPU quota in the spirit of Kueue cohorts."""

    nominal_gpus: Gpus = Field(description="GPUs the team is entitled to.")
    borrowing_limit_gpus: Gpus | SkipJsonSchema[None] = _optional(
        "At most this many GPUs beyond nominal, out of quota others leave unused; leave out for no limit."
    )
    lending_limit_gpus: Gpus | SkipJsonSchema[None] = _optional(
        "At most this many of the team's unused GPUs are lent to others; leave out to lend all of them."
    )


class TeamPriority(_Data):
    tier: str | SkipJsonSchema[None] = _optional("A name from `tiers`; leave out for the default's tier.")
    weight: Annotated[float, Field(gt=0)] | SkipJsonSchema[None] = _optional("Overrides the tier's weight.")
    capacity: Literal["any", "spot_only", "on_demand_only"] = Field(
        "any", description="Which capacity types the team may use."
    )
    quota: Quota | SkipJsonSchema[None] = _optional("Leave out for no GPU limit (the budget still applies).")


class PrioritiesData(_Data):
    """`data/priorities.yaml`: tiers, weights, capacity types, GPU quotas (read by priorities.rego).

    Besides the schema: every `tier` a team or the default names must be a key of `tiers`.
    """

    tiers: dict[str, Tier] = Field(default_factory=dict, description="Tiers by name.")
    default: TeamPriority = Field(default_factory=TeamPriority, description="Any team not listed under `teams`.")
    teams: dict[str, TeamPriority] = Field(default_factory=dict, description="Per team, by name.")

    @model_validator(mode="after")
    def _tiers_defined(self) -> PrioritiesData:
        # The same rule as _tier_problems (which says where), for code using the model.
        for who, conf in [("default", self.default), *((f"teams.{t}", c) for t, c in self.teams.items())]:
            if conf.tier is not None and conf.tier not in self.tiers:
                raise ValueError(f"{who}.tier: tier {conf.tier!r} is not defined in `tiers`")
        return self


# ---------------------------------------------------------------- placement.yaml


class TeamPlacement(_Data):
    pools: Names | SkipJsonSchema[None] = _optional("Pool names the team may use.")
    regions: Names | SkipJsonSchema[None] = _optional("Regions the team may use.")
    max_spot_price_usd: Usd | None = Field(
        None, description="The team's cap on a spot instance, USD per hour; null = no cap."
    )


class QueuePlacement(_Data):
    pools: Names | SkipJsonSchema[None] = _optional("Pool names the queue may use (of those it is configured with).")
    regions: Names | SkipJsonSchema[None] = _optional("Regions the queue may use.")


class PoolPlacement(_Data):
    max_instances: Gpus = Field(description="Cap on the pool's instances, on top of its own configuration.")


class PlacementData(_Data):
    """`data/placement.yaml`: where work may run (read by placement.rego)."""

    onprem_first: bool = Field(
        False, description="Cloud pools do not grow while idle on-prem machines cover the backlog."
    )
    max_spot_price_usd: Usd | None = Field(None, description="Cap on a spot instance, USD per hour; null = no cap.")
    teams: dict[str, TeamPlacement] = Field(default_factory=dict, description="A team not listed may use every pool.")
    queues: dict[str, QueuePlacement] = Field(default_factory=dict)
    pools: dict[str, PoolPlacement] = Field(default_factory=dict)


# The data files the shipped policies read, by name (`data/<name>.yaml` is `data.<name>`).
SHIPPED: dict[str, type[BaseModel]] = {
    "budgets": BudgetsData,
    "priorities": PrioritiesData,
    "placement": PlacementData,
}


def export_data_schemas(version: str) -> dict[str, dict[str, Any]]:
    return {f"policy-data-{name}.v{version}.json": model.model_json_schema() for name, model in SHIPPED.items()}


# ---------------------------------------------------------------- checking


_TYPE_WORDS = {
    "number": "a number",
    "integer": "a whole number",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _dotted(path: Iterable[Any]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _expected_types(schema_type: Any) -> str:
    kinds = schema_type if isinstance(schema_type, list) else [schema_type]
    return " or ".join(_TYPE_WORDS.get(str(k), str(k)) for k in kinds)


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]}?"
    return "expected one of " + ", ".join(choices) if choices else "no keys are allowed here"


def _render(error: Any) -> list[tuple[tuple[Any, ...], str]]:
    """(key path, message) for one jsonschema error, in words a FinOps reader knows."""
    path = tuple(error.absolute_path)
    kind, value, instance, schema = error.validator, error.validator_value, error.instance, error.schema
    if kind == "additionalProperties" and value is False and isinstance(instance, dict):
        known = list(schema.get("properties", {}))
        extras = [k for k in instance if k not in known]
        return [((*path, k), f"unknown key ({_suggest(str(k), known)})") for k in extras]
    if kind == "required" and isinstance(instance, dict):
        return [((*path, k), "missing (this key is required)") for k in value if k not in instance]
    if kind == "type":
        # `teams:` with every entry commented out reads as null, which Rego cannot look into.
        hint = " (write {} for none)" if instance is None and value == "object" else ""
        return [(path, f"expected {_expected_types(value)}, got {_show(instance)}{hint}")]
    if kind == "enum":
        return [(path, f"{_show(instance)} is not one of {', '.join(str(v) for v in value)}")]
    if kind == "const":
        return [(path, f"{_show(instance)} is not {_show(value)}")]
    if kind == "exclusiveMinimum":
        return [(path, f"must be greater than {value}, got {_show(instance)}")]
    if kind == "minimum":
        return [(path, f"must be at least {value}, got {_show(instance)}")]
    if kind == "exclusiveMaximum":
        return [(path, f"must be less than {value}, got {_show(instance)}")]
    if kind == "maximum":
        return [(path, f"must be at most {value}, got {_show(instance)}")]
    if kind in ("anyOf", "oneOf") and isinstance(value, list):
        nullable = any(isinstance(s, dict) and s.get("type") == "null" for s in value)
        others = [i for i, s in enumerate(value) if not (isinstance(s, dict) and s.get("type") == "null")]
        if nullable and len(others) == 1:
            inner = [
                e for e in error.context or [] if e.relative_schema_path and e.relative_schema_path[0] == others[0]
            ]
            if inner:
                first = inner[0]
                if first.validator == "type":
                    return [(path, f"expected {_expected_types(first.validator_value)} or null, got {_show(instance)}")]
                return [(p, _or_null(msg)) for p, msg in _render(first)]
    return [(path, error.message)]


def _or_null(message: str) -> str:
    head, sep, tail = message.rpartition(", got ")
    return f"{head} or null, got {tail}" if sep else f"{message} (or null)"


def _line_of(root: yaml.Node | None, path: Sequence[Any]) -> int | None:
    """1-based line of the key (or item) at `path` in a composed YAML document."""
    node, line = root, (root.start_mark.line + 1 if root is not None else None)
    for part in path:
        if isinstance(node, yaml.MappingNode):
            for key, child in node.value:
                if key.value == str(part):
                    node, line = child, key.start_mark.line + 1
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _compose(text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text)
    except yaml.YAMLError:  # the document itself was read already; this only finds lines
        return None


def key_line(text: str, path: Sequence[Any]) -> int | None:
    """1-based line of the key at `path` in a data file's text (JSON is YAML too)."""
    return _line_of(_compose(text), path)


def _validator(schema: dict[str, Any]) -> Any:
    from jsonschema import Draft202012Validator, validators

    cls = validators.validator_for(schema, default=Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def _schema_problems(rel: str, text: str, doc: Any, schema: dict[str, Any]) -> list[Problem]:
    root = _compose(text)
    seen: set[tuple[tuple[Any, ...], str]] = set()
    problems: list[Problem] = []
    errors = sorted(_validator(schema).iter_errors(doc), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    for error in errors:
        for path, message in _render(error):
            if (path, message) in seen:
                continue
            seen.add((path, message))
            where = _dotted(path)
            problems.append(Problem(rel, _line_of(root, path), f"{where}: {message}" if where else message))
    return sorted(problems, key=lambda p: (p.line or 0, p.message))


def _tier_problems(rel: str, text: str, doc: Any) -> list[Problem]:
    """priorities.yaml: every tier a team or the default names is defined in `tiers`."""
    if not isinstance(doc, dict):
        return []
    raw_tiers, default, teams = doc.get("tiers"), doc.get("default"), doc.get("teams")
    tiers: dict[str, Any] = raw_tiers if isinstance(raw_tiers, dict) else {}
    named: list[tuple[tuple[Any, ...], Any]] = []
    if isinstance(default, dict):
        named.append((("default", "tier"), default.get("tier")))
    for team, conf in teams.items() if isinstance(teams, dict) else ():
        if isinstance(conf, dict):
            named.append((("teams", team, "tier"), conf.get("tier")))
    root = _compose(text)
    problems = []
    for path, tier in named:
        if isinstance(tier, str) and tier not in tiers:
            hint = _suggest(tier, list(tiers)) if tiers else "`tiers` defines none"
            message = f"{_dotted(path)}: tier {tier!r} is not defined in `tiers` ({hint})"
            problems.append(Problem(rel, _line_of(root, path), message))
    return problems


def validate_data(directory: Path, files: dict[str, tuple[str, str, Any]], *, overlay: bool = False) -> list[Problem]:
    """Problems of the data files against their schemas.

    `files` maps a data name (`budgets`) to (path relative to the directory, text,
    parsed document). User schemas are read from `directory/data/*.schema.json`.
    `overlay`: `files` replace only some of `data/` (a deployment's or a test's data
    directory), so a schema without a file among them is no problem.
    """
    problems: list[Problem] = []
    user: dict[str, tuple[str, dict[str, Any]]] = {}
    data_dir = directory / "data"
    for path in sorted(data_dir.glob("*" + SCHEMA_SUFFIX)) if data_dir.is_dir() else []:
        rel = str(path.relative_to(directory))
        name = path.name[: -len(SCHEMA_SUFFIX)]
        try:
            schema = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(Problem(rel, None, f"cannot read the schema: {exc}"))
            continue
        except json.JSONDecodeError as exc:
            problems.append(Problem(rel, exc.lineno, f"not valid JSON: {exc.msg}", exc.colno))
            continue
        if not isinstance(schema, dict):
            problems.append(Problem(rel, 1, "a JSON Schema must be an object"))
            continue
        try:
            _validator(schema)
        except Exception as exc:  # jsonschema.SchemaError; its message is a paragraph
            first = str(getattr(exc, "message", exc)).splitlines()[0]
            where = _dotted(getattr(exc, "absolute_path", ()))
            problems.append(Problem(rel, None, f"not a valid JSON Schema: {where + ': ' if where else ''}{first}"))
            continue
        if name not in files:
            if overlay:
                continue
            problems.append(Problem(rel, None, f"no data file data/{name}.yaml (or .yml, .json) to apply it to"))
            continue
        user[name] = (rel, schema)
    for name, (rel, text, doc) in sorted(files.items()):
        model = SHIPPED.get(name)
        found: list[Problem] = []
        if model is not None:
            found += _schema_problems(rel, text, doc, model.model_json_schema())
            if name == "priorities":
                found += _tier_problems(rel, text, doc)
        if name in user:
            found += _schema_problems(rel, text, doc, user[name][1])
        problems += sorted(found, key=lambda p: (p.line or 0, p.message))
    return problems
