"""A policy directory read into memory: Rego modules, the data FinOps edit, test cases.

Layout (see docs/policies.md):

    policies/
      *.rego              the rules (OPA v1 syntax: `import rego.v1`, `if`, `contains`)
      data/<name>.yaml    loaded as `data.<name>` (YAML or JSON), checked against its
                          schema (autoscaler/policy/data_schema.py) when it has one
      data/<name>.schema.json  a user's JSON Schema for data/<name>.yaml
      tests/*.yaml        table-driven cases: an input and the expected part of the decision
      tests/<dir>/*.yaml  data a test file runs on instead (`data_dir: <dir>` in the file)

A deployment's own data may live outside the policy directory (`policy.data_dir` in
the config, `load_bundle(..., data_dir=)`): its files replace the same-named files of
`data/`. That is how the example config brings its demo teams without the shipped
policies naming them in every deployment.

The revision is a content hash of the rules and the data (not the tests): the same
revision always gives the same decision for the same input, which is what a recorded
decision needs in order to be explained later.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autoscaler.policy.data_schema import SCHEMA_SUFFIX, validate_data
from autoscaler.policy.problems import PolicyError, Problem

# The document the service asks for: `data.<package>.decision`.
DECISION_RULE = "decision"


def shipped_policy_dir() -> Path:
    """The default policies: `policies/` at the repository root, next to `autoscaler/`."""
    return Path(__file__).resolve().parents[2] / "policies"


def entrypoint(package: str) -> str:
    return package.replace(".", "/") + "/" + DECISION_RULE


@dataclass(frozen=True)
class TestCase:
    name: str
    file: str
    input: dict[str, Any]
    expect: dict[str, Any]
    absent: tuple[str, ...] = ()  # dotted paths that must not be in the decision
    # How far a number may be from the expected one, relative (absolute below 1).
    tolerance: float = 1e-6
    # The whole data document this case runs on, when its file or the case itself
    # changes the bundle's (`data_dir:`, `data:`); None: the bundle's data.
    data: dict[str, Any] | None = None


@dataclass(frozen=True)
class PolicyBundle:
    directory: Path
    modules: dict[str, str]  # relative path -> Rego source
    data: dict[str, Any]
    revision: str
    cases: list[TestCase] = field(default_factory=list)
    # Where each data document was read: name -> (the file as reported, its text), so
    # a note about its content can name the file and line (`data_teams`).
    sources: dict[str, tuple[str, str]] = field(default_factory=dict)


def _read_structured(path: Path, rel: str, text: str | None = None) -> Any:
    text = path.read_text() if text is None else text
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise PolicyError("policy data is not valid JSON", [Problem(rel, exc.lineno, exc.msg, exc.colno)]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        line = mark.line + 1 if mark else None
        col = mark.column + 1 if mark else None
        raise PolicyError("policy file is not valid YAML", [Problem(rel, line, problem, col)]) from None


def _structured_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file())


def merge_data(base: Any, over: Any) -> Any:
    """`over` laid on `base`: mappings merge key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = merge_data(base.get(key), value)
        return out
    return over


def _override(rel: str, where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PolicyError(
            "bad test case",
            [Problem(rel, None, f"{where}: `data` must map data file names to what to change in them")],
        )
    return value


# What a test file and a case may say. Anything else is refused: a misspelt `absent`
# or `tolerance` would otherwise be dropped and the case pass without checking it.
FILE_KEYS = ("cases", "data_dir", "data")
CASE_KEYS = ("name", "input", "expect", "absent", "tolerance", "data")


def _unknown_key(given: dict[str, Any], known: tuple[str, ...]) -> str | None:
    """The first key of `given` not in `known`, said with the closest known one."""
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean `{close[0]}`?" if close else "the keys are " + ", ".join(f"`{k}`" for k in known)
            return f"unknown key `{key}` ({hint})"
    return None


def _case_problem(item: Any, number: int) -> str | None:
    """What is wrong with one case's shape, or None."""
    if not isinstance(item, dict) or not isinstance(item.get("input"), dict) or "expect" not in item:
        return f"case #{number} needs `name`, an `input` mapping and `expect`"
    if unknown := _unknown_key(item, CASE_KEYS):
        return f"case #{number}: {unknown}"
    if not isinstance(item["expect"], dict):
        return f"case #{number}: `expect` must be a mapping of decision keys to their values, not {item['expect']!r}"
    if item.get("absent") is not None and not isinstance(item["absent"], list):
        return f"case #{number}: `absent` must be a list of decision paths, e.g. [pools.aws-a100]"
    return None


def load_cases(directory: Path, data: dict[str, Any] | None = None) -> list[TestCase]:
    """The cases of `directory/tests/*.yaml`. A file may say `data_dir: <dir>` (data
    files, relative to the test file, that replace the bundle's of the same name) and
    `data:` (a mapping laid over the data); a case may say `data:` too. `data` is the
    bundle's data those start from."""
    cases: list[TestCase] = []
    tests = directory / "tests"
    base = data or {}
    for path in _structured_files(tests):
        rel = str(path.relative_to(directory))
        doc = _read_structured(path, rel)
        items = doc.get("cases") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise PolicyError("bad test file", [Problem(rel, 1, "expected a mapping with a `cases:` list")])
        assert isinstance(doc, dict)
        if unknown := _unknown_key(doc, FILE_KEYS):
            raise PolicyError("bad test file", [Problem(rel, 1, unknown)])
        file_data: dict[str, Any] | None = None
        if doc.get("data_dir") is not None:
            fixtures = (path.parent / str(doc["data_dir"])).resolve()
            if not fixtures.is_dir():
                raise PolicyError(
                    "bad test file",
                    [Problem(rel, 1, f"data_dir {doc['data_dir']!r} is not a directory next to this file")],
                )
            file_data = {**base, **_read_data(directory, fixtures)}
        if doc.get("data") is not None:
            file_data = merge_data(file_data or base, _override(rel, "the file", doc["data"]))
        for i, item in enumerate(items):
            if problem := _case_problem(item, i + 1):
                raise PolicyError("bad test case", [Problem(rel, None, problem)])
            tolerance = item.get("tolerance", 1e-6)
            if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not 0 <= tolerance < 1:
                raise PolicyError(
                    "bad test case",
                    [
                        Problem(
                            rel,
                            None,
                            f"case #{i + 1}: tolerance must be a number from 0 to below 1 (a relative error, "
                            f"e.g. 0.01 for 1 %), not {tolerance!r}",
                        )
                    ],
                )
            case_data = file_data
            if item.get("data") is not None:
                case_data = merge_data(file_data or base, _override(rel, f"case #{i + 1}", item["data"]))
            cases.append(
                TestCase(
                    name=str(item.get("name") or f"case {i + 1}"),
                    file=rel,
                    input=item["input"],
                    expect=item["expect"],
                    absent=tuple(str(a) for a in item.get("absent") or ()),
                    tolerance=float(tolerance),
                    data=case_data,
                )
            )
    return cases


def _read_data(
    directory: Path, data_dir: Path, *, overlay: bool = True, sources: dict[str, tuple[str, str]] | None = None
) -> dict[str, Any]:
    """The data files of `data_dir`, each checked against its schema (a schema of the
    policy directory's, or a shipped one); `sources` gets each one's file and text."""
    data: dict[str, Any] = {}
    read: dict[str, tuple[str, str, Any]] = {}
    for path in _structured_files(data_dir):
        if path.name.endswith(SCHEMA_SUFFIX):  # a user's schema for a data file, not data
            continue
        rel = str(path.relative_to(directory)) if path.is_relative_to(directory) else str(path)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyError("cannot read policy data", [Problem(rel, None, str(exc))]) from None
        doc = _read_structured(path, rel, text)
        data[path.stem] = doc if doc is not None else {}
        read[path.stem] = (rel, text, data[path.stem])
        if sources is not None:
            sources[path.stem] = (rel, text)
    problems = validate_data(directory, read, overlay=overlay)
    if problems:
        raise PolicyError("policy data does not match its schema", problems)
    return data


def load_bundle(directory: Path, *, with_cases: bool = True, data_dir: Path | None = None) -> PolicyBundle:
    """Read a policy directory, with `data_dir`'s data files (if any) replacing the
    same-named ones of `data/`. Raises PolicyError (with file:line) for unreadable files."""
    directory = Path(directory)
    if not directory.is_dir():
        raise PolicyError(f"policy directory {directory} does not exist; pass a directory holding *.rego files")
    modules: dict[str, str] = {}
    for path in sorted(directory.rglob("*.rego")):
        rel = str(path.relative_to(directory))
        try:
            modules[rel] = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyError("cannot read policy", [Problem(rel, None, str(exc))]) from None
    if not modules:
        raise PolicyError(f"policy directory {directory} holds no *.rego files")
    sources: dict[str, tuple[str, str]] = {}
    data = _read_data(directory, directory / "data", overlay=False, sources=sources)
    if data_dir is not None:
        if not Path(data_dir).is_dir():
            raise PolicyError(
                f"policy data directory {data_dir} does not exist; set policy.data_dir to a directory of "
                "data files (budgets.yaml, placement.yaml, priorities.yaml) or remove it"
            )
        data.update(_read_data(directory, Path(data_dir), sources=sources))
    digest = hashlib.sha256()
    for rel, source in sorted(modules.items()):
        digest.update(rel.encode() + b"\0" + source.encode() + b"\0")
    digest.update(json.dumps(data, sort_keys=True, default=str).encode())
    cases = load_cases(directory, data) if with_cases else []
    return PolicyBundle(
        directory=directory,
        modules=modules,
        data=data,
        revision=digest.hexdigest()[:16],
        cases=cases,
        sources=sources,
    )


def directory_fingerprint(directory: Path, *more: Path) -> str:
    """Cheap change detector for hot reload: names, sizes and mtimes of every file."""
    digest = hashlib.sha256()
    for root in (directory, *more):
        if root.is_dir():
            for path in sorted(root.rglob("*")):
                if path.is_file():
                    st = path.stat()
                    digest.update(f"{path}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()
