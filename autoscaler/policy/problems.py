"""Problems found in a policy directory, each with the file and line a reader must fix."""

from __future__ import annotations

from dataclasses import dataclass

from autoscaler.errors import AutoscalerError


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    message: str
    col: int | None = None

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.col is not None:
                where += f":{self.col}"
        return f"{where}: {self.message}"


class PolicyError(AutoscalerError):
    """A policy directory that cannot be put in force; the message lists every problem."""

    http_status = 422

    def __init__(self, summary: str, problems: list[Problem] | None = None) -> None:
        self.problems = list(problems or [])
        message = summary
        if self.problems:
            message += ": " + "; ".join(str(p) for p in self.problems)
        super().__init__(message)


def line_col(source: str, offset: int) -> tuple[int, int]:
    """1-based line and column of a byte offset into `source` (rego-cpp reports offsets)."""
    prefix = source.encode()[:offset].decode(errors="replace")
    line = prefix.count("\n") + 1
    col = len(prefix) - (prefix.rfind("\n") + 1) + 1
    return line, col
