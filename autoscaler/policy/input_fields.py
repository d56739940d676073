"""Which input fields the loaded policies can read, so the engine is handed only those.

Reading the input is a large part of an evaluation (1,000 queues are most of the
bench input's bytes, and no shipped rule reads a queue's depth), so the embedded
engine is handed only the fields some loaded policy names. The rule must never drop
a field a policy reads: a dropped field is silently undefined in Rego, and a rule
that reads it stops matching without an error.

The rule, conservative by construction (a false positive only adds bytes):

- a field is sent when its name appears as a whole word anywhere in the text of a
  loaded module (code, strings, comments) or of the policy data (a key or a string
  value there could be used as a dynamic key);
- everything is sent when a module can see keys it does not name: the whole input
  used as a value (`x := input`, `f(input)`, `with input as`, `import input`), or a
  builtin that walks, serialises, prints or lists an object's keys (`walk`,
  `json.marshal`, `object.keys`, `print`, ...). Strings and comments are ignored for
  this test, so a message that says "input" does not turn the trimming off.

What the rule cannot see, and docs/policies.md says so: a key assembled at run time
from pieces (`concat("_", ["pending", "gpus"])`), or a whole input object (a queue)
printed with `%v`, counted or compared through a variable. Naming the field anywhere,
a comment will do, makes sure it is sent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from autoscaler.policy.schema import PolicyInput, PoolInput, QueueInput, SpotOfferingInput, TeamInput

# The input's objects, by where they sit: "" is the document itself; a list's elements
# are named by the list's path.
OBJECTS: dict[str, type[BaseModel]] = {
    "": PolicyInput,
    "teams": TeamInput,
    "queues": QueueInput,
    "pools": PoolInput,
    "pools.spot_offerings": SpotOfferingInput,
}

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Builtins that see an object's keys or whole value without naming a key.
_KEY_READERS = re.compile(
    r"(?<![\w.])(walk|print|json\.\w+|yaml\.\w+|object\.(?:keys|filter|remove|union|union_n|subset)"
    r"|graph\.\w+|type_name)\s*\("
)
# `input` not followed by `.` or `[`: the whole document handed on as a value.
_WHOLE_INPUT = re.compile(r"(?<![\w.])input\b(?!\s*[.\[])")


def code_only(source: str) -> str:
    """A Rego module without its comments and string literals (each string becomes `""`)."""
    out: list[str] = []
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c == "#":
            end = source.find("\n", i)
            i = n if end < 0 else end
        elif c == '"':
            i += 1
            while i < n and source[i] != '"':
                i += 2 if source[i] == "\\" else 1
            out.append('""')
            i += 1
        elif c == "`":
            end = source.find("`", i + 1)
            out.append('""')
            i = n if end < 0 else end + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def sees_unnamed_keys(modules: dict[str, str]) -> bool:
    """Whether some module can read an input field without naming it (see the module doc)."""
    for source in modules.values():
        code = code_only(source)
        if _KEY_READERS.search(code) or _WHOLE_INPUT.search(code):
            return True
    return False


def named_words(modules: dict[str, str], data: dict[str, Any]) -> set[str]:
    """Every identifier-like word of the modules' text and of the data's JSON text."""
    words: set[str] = set()
    for source in modules.values():
        words.update(_WORD.findall(source))
    words.update(_WORD.findall(json.dumps(data, default=str)))
    return words


@dataclass(frozen=True)
class InputSelection:
    """The fields left out of the document the engine is handed, as pydantic's `exclude`.

    `exclude` is None when everything is sent.
    """

    exclude: dict[str, Any] | None
    left_out: tuple[str, ...] = ()

    @classmethod
    def everything(cls) -> InputSelection:
        return cls(None)

    @classmethod
    def for_policy(cls, modules: dict[str, str], data: dict[str, Any]) -> InputSelection:
        if sees_unnamed_keys(modules):
            return cls.everything()
        words = named_words(modules, data)
        left_out: list[str] = []
        excluded: dict[str, dict[str, Any]] = {path: {} for path in OBJECTS}
        for path, model in OBJECTS.items():
            for field in model.model_fields:
                full = f"{path}.{field}" if path else field
                if field not in words:
                    excluded[path][field] = True
                    left_out.append(full)
        # Nest the element exclusions under their lists, in pydantic's form:
        # {"queues": {"__all__": {"depth": True}}}. A list that is itself left out
        # stays `True` (its elements do not matter).
        for path in sorted((p for p in OBJECTS if p), key=lambda p: -p.count(".")):
            parent, _, name = path.rpartition(".")
            fields = excluded.pop(path)
            if fields and excluded[parent].get(name) is not True:
                excluded[parent][name] = {"__all__": fields}
        top = excluded[""]
        return cls(top or None, tuple(left_out))
