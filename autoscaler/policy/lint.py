"""Static checks for what the embedded interpreters accept too leniently or read differently.

rego-cpp compiles things OPA v1 would refuse (a rule body without `if`, a partial
set without `contains`; regorus refuses the first, accepts the second as OPA does);
in both, a call to a function that does not exist fails only when its rule is
evaluated, and a typo in an input field (`input.teams[_].burn_rate`) is not an error
at all: the rule silently never matches, which for a budget means it never fires.
Where the two interpreters disagree with OPA (rego-cpp's max()/min() compare numbers
as text; regorus's sprintf rounds a `%.Nf` tie away from zero) the construct is
refused, so a policy means the same whichever interpreter `policy.interpreter`
names. They read source text, so they are pure functions; the builtin lookup is
passed in.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from autoscaler.policy.problems import Problem
from autoscaler.policy.schema import PolicyInput

_KEYWORDS = {
    "if",
    "not",
    "some",
    "every",
    "in",
    "contains",
    "else",
    "with",
    "as",
    "default",
    "import",
    "package",
}
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"|`[^`]*`')
_COMMENT = re.compile(r"#[^\n]*")
_CALL = re.compile(r"(?<![\w.\]])([a-z_][\w]*(?:\.[a-z_][\w]*)*)\(")
_FUNC_HEAD = re.compile(r"^([a-z_][\w]*)\(", re.MULTILINE)
_IMPORT = re.compile(r"^import\s+([\w.]+)(?:\s+as\s+(\w+))?", re.MULTILINE)
_PACKAGE = re.compile(r"^package\s+([\w.]+)", re.MULTILINE)
_INPUT_PATH = re.compile(r"\binput((?:\.[A-Za-z_]\w*|\[[^\]\[]*\])+)")
_BIND_SOME = re.compile(r"\bsome\s+(\w+)\s+in\s+input((?:\.\w+|\[[^\]\[]*\])+)")
_BIND_ASSIGN = re.compile(r"\b(\w+)\s*:=\s*input((?:\.\w+|\[[^\]\[]*\])+)\[_\]")
_DATA_ROOT = re.compile(r"\bdata\.([A-Za-z_]\w*)")


def strip_strings_and_comments(source: str) -> str:
    """Blank out strings and comments, keeping offsets and line numbers intact."""

    def blank(m: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    return _COMMENT.sub(blank, _STRING.sub(lambda m: '"' + " " * (len(m.group(0)) - 2) + '"', source))


def _line(source: str, offset: int) -> int:
    return source.count("\n", 0, offset) + 1


def _top_level_chunks(code: str) -> list[tuple[int, str]]:
    """Split a module into statements starting at column 0: (offset, text)."""
    starts = [m.start() for m in re.finditer(r"^(?=\S)", code, re.MULTILINE)]
    chunks = []
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(code)
        chunks.append((start, code[start:end]))
    return chunks


def check_syntax_leniency(rel: str, source: str) -> list[Problem]:
    code = strip_strings_and_comments(source)
    problems: list[Problem] = []
    if not re.search(r"^import\s+rego\.v1\b", code, re.MULTILINE):
        problems.append(Problem(rel, 1, "add `import rego.v1` so the file means the same to OPA v1 and rego-cpp"))
    for offset, chunk in _top_level_chunks(code):
        head = chunk.split("\n", 1)[0]
        first = head.split(None, 1)[0] if head.split() else ""
        if first in ("package", "import", "}", "]", ")") or first.startswith("#"):
            continue
        before_brace = head.split("{", 1)[0] if "{" in head else None
        if before_brace is not None and not re.search(r"\b(if|contains)\b", before_brace):
            stripped = before_brace.rstrip()
            # `x := {` and `f(a) := [{` open a literal; `allow {`, `p[x] {`, `x := 1 {` open a body.
            if stripped and not re.search(r"(:=|=|,|\(|\[|\bin)$", stripped):
                problems.append(
                    Problem(rel, _line(source, offset), "rule body without `if`: write `... if { ... }` (OPA v1)")
                )
                continue
        if re.match(r"^[a-z_]\w*\[\s*[a-z_]\w*\s*\]\s+if\b", head):
            problems.append(
                Problem(
                    rel,
                    _line(source, offset),
                    "multi-value rule needs `contains`: write `name contains x if`",
                )
            )
    return problems


def check_functions(modules: dict[str, str], unknown: Callable[[list[str]], list[str]]) -> list[Problem]:
    """Calls to functions that are neither builtins nor defined by the policy."""
    defined: set[str] = set()
    aliases: set[str] = {"data", "input", "future", "rego"}
    for source in modules.values():
        code = strip_strings_and_comments(source)
        defined.update(_FUNC_HEAD.findall(code))
        for path, alias in _IMPORT.findall(code):
            aliases.add(alias or path.rsplit(".", 1)[-1])
    calls: dict[str, tuple[str, int]] = {}
    for rel, source in sorted(modules.items()):
        code = strip_strings_and_comments(source)
        for m in _CALL.finditer(code):
            name = m.group(1)
            root = name.split(".", 1)[0]
            if name in _KEYWORDS or name in defined or root in aliases or name in calls:
                continue
            calls[name] = (rel, _line(source, m.start()))
    missing = set(unknown(sorted(calls))) if calls else set()
    return [
        Problem(rel, line, f"unknown function {name}(): not a Rego builtin nor defined in this policy")
        for name, (rel, line) in sorted(calls.items(), key=lambda kv: kv[1])
        if name in missing
    ]


# ------------------------------------------------------------------ input paths


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    if "anyOf" in node:  # Optional[X]: follow the non-null branch
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        if len(branches) == 1:
            return _resolve(schema, branches[0])
    return node


_SEGMENT = re.compile(r"\.([A-Za-z_]\w*)|\[([^\]\[]*)\]")


def _walk(schema: dict[str, Any], node: dict[str, Any], path: str) -> tuple[dict[str, Any] | None, str | None]:
    """Follow `.a[_].b` through the schema; returns (node, None) or (None, bad field)."""
    for m in _SEGMENT.finditer(path):
        node = _resolve(schema, node)
        field = m.group(1)
        if field is not None:
            props = node.get("properties")
            if props is None:
                return None, None  # a map (dict[str, X]) or unknown shape: nothing to check
            if field not in props:
                return None, field
            node = props[field]
        else:
            if node.get("type") == "array":
                node = node.get("items", {})
            elif "additionalProperties" in node and isinstance(node["additionalProperties"], dict):
                node = node["additionalProperties"]
            else:
                return None, None
    return _resolve(schema, node), None


def check_input_fields(rel: str, source: str, schema: dict[str, Any] | None = None) -> list[Problem]:
    """Flag `input...` field names (and fields of variables bound from input) the schema lacks."""
    schema = schema or PolicyInput.model_json_schema()
    code = strip_strings_and_comments(source)
    problems: list[Problem] = []
    seen: set[tuple[int, str]] = set()

    def report(offset: int, field: str, where: str) -> None:
        line = _line(source, offset)
        if (line, field) in seen:
            return
        seen.add((line, field))
        known = sorted(_resolve(schema, node_for(where) or {}).get("properties", {}))
        hint = f" (known: {', '.join(known)})" if known else ""
        problems.append(
            Problem(
                rel,
                line,
                f"input has no field `{field}` at {where or 'the top level'}{hint}: a rule reading it never matches",
            )
        )

    def node_for(where: str) -> dict[str, Any] | None:
        node, _ = _walk(schema, schema, where)
        return node

    for offset, chunk in _top_level_chunks(code):
        for m in _INPUT_PATH.finditer(chunk):
            path = m.group(1)
            _, bad = _walk(schema, schema, path)
            if bad:
                parent = path[: path.find("." + bad)] if ("." + bad) in path else ""
                report(offset + m.start(), bad, "input" + parent)
        bindings: dict[str, dict[str, Any]] = {}
        for pattern in (_BIND_SOME, _BIND_ASSIGN):
            for m in pattern.finditer(chunk):
                node, _ = _walk(schema, schema, m.group(2) + "[_]")
                if node is not None and "properties" in node:
                    bindings[m.group(1)] = node
        for var, node in bindings.items():
            for m in re.finditer(rf"(?<![\w.]){re.escape(var)}((?:\.[A-Za-z_]\w*|\[[^\]\[]*\])+)", chunk):
                _, bad = _walk(schema, node, m.group(1))
                if bad:
                    known = ", ".join(sorted(node.get("properties", {})))
                    line = _line(source, offset + m.start())
                    if (line, bad) not in seen:
                        seen.add((line, bad))
                        problems.append(
                            Problem(
                                rel,
                                line,
                                f"`{var}.{bad}`: {var} comes from input and has no field `{bad}` "
                                f"(known: {known}): a rule reading it never matches",
                            )
                        )
    return problems


def check_data_roots(modules: dict[str, str], data: dict[str, Any]) -> list[Problem]:
    """`data.X` must be a data file (policies/data/X.yaml) or a policy package."""
    roots = set(data)
    for source in modules.values():
        pkg = _PACKAGE.search(source)
        if pkg:
            roots.add(pkg.group(1).split(".", 1)[0])
    problems = []
    for rel, source in sorted(modules.items()):
        code = strip_strings_and_comments(source)
        for m in _DATA_ROOT.finditer(code):
            if m.group(1) not in roots:
                problems.append(
                    Problem(
                        rel,
                        _line(source, m.start()),
                        f"data.{m.group(1)} does not exist: no data/{m.group(1)}.yaml, no such package",
                    )
                )
    return problems


_TEXTUAL_NUMERIC = re.compile(r"(?<![\w.])(max|min)\(")


def check_textual_comparisons(rel: str, source: str) -> list[Problem]:
    """rego-cpp 1.5 compares numbers as text in max()/min(): max([80, 100]) is 80."""
    code = strip_strings_and_comments(source)
    return [
        Problem(
            rel,
            _line(source, m.start()),
            f"{m.group(1)}() compares numbers as text in rego-cpp (max([80, 100]) is 80); "
            f"use lib.{m.group(1)}_of() from lib.rego",
        )
        for m in _TEXTUAL_NUMERIC.finditer(code)
    ]


_FIXED_POINT = re.compile(r"%[-+ #0]*\d*\.\d+f")


def check_fixed_point_formats(rel: str, source: str) -> list[Problem]:
    """regorus rounds a tie in `%.0f` away from zero (102.5 -> 103); OPA and rego-cpp to even (102)."""
    blanked_comments = _COMMENT.sub(
        lambda m: " " * len(m.group(0)), _STRING.sub(lambda m: "_" * len(m.group(0)), source)
    )
    problems = []
    for m in _STRING.finditer(source):
        if blanked_comments[m.start()] == " ":
            continue  # a string inside a comment
        for fmt in _FIXED_POINT.finditer(m.group(0)):
            problems.append(
                Problem(
                    rel,
                    _line(source, m.start()),
                    f"sprintf format {fmt.group(0)} rounds a tie differently in regorus and OPA/rego-cpp "
                    "(102.5 prints 103 or 102); print whole numbers with %d and lib.whole(x)",
                )
            )
    return problems


def lint(modules: dict[str, str], data: dict[str, Any], unknown: Callable[[list[str]], list[str]]) -> list[Problem]:
    problems: list[Problem] = []
    for rel, source in sorted(modules.items()):
        problems += check_syntax_leniency(rel, source)
        problems += check_input_fields(rel, source)
        problems += check_textual_comparisons(rel, source)
        problems += check_fixed_point_formats(rel, source)
    problems += check_functions(modules, unknown)
    problems += check_data_roots(modules, data)
    return problems
