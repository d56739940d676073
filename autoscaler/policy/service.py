"""The policy service: owns the engine in force, evaluates, and hot-reloads safely.

A reload reads the directory, compiles it in a NEW engine (its own child process),
runs the leniency checks and every test case in `tests/*.yaml`, and only then swaps
it in and closes the old one. Any failure keeps the last good bundle in force and
is reported three ways: `status()` (served at GET /api/v1/policy), the log, and the
metrics `autoscaler_policy_reloads_total{result}` / `autoscaler_policy_reload_ok`.

`check_for_changes()` is the file watch: a cheap fingerprint of the directory
(names, sizes, mtimes), meant to be called every few seconds by the scheduler.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from autoscaler.clock import Clock, SystemClock
from autoscaler.config import PolicyConfig
from autoscaler.errors import ConfigError
from autoscaler.policy.bundle import directory_fingerprint, load_bundle, shipped_policy_dir
from autoscaler.policy.cases import check_and_test
from autoscaler.policy.data_teams import undeclared_teams
from autoscaler.policy.engines import EmbeddedEngine, OpaEngine
from autoscaler.policy.problems import PolicyError
from autoscaler.policy.schema import EvaluationResult, PolicyInput

log = logging.getLogger(__name__)

RELOADS = Counter("autoscaler_policy_reloads", "Policy reload attempts by result.", ["result"])
RELOAD_OK = Gauge("autoscaler_policy_reload_ok", "1 if the last policy reload succeeded, 0 if it was refused.")
EVAL_SECONDS = Histogram("autoscaler_policy_eval_seconds", "Policy evaluation time, child round trip included.")
EVAL_FAILURES = Counter("autoscaler_policy_eval_failures", "Evaluations that failed safe.")


@dataclass
class ReloadOutcome:
    ok: bool
    revision: str  # the revision in force after the attempt
    candidate: str | None  # the revision that was tried, when it could be read
    message: str
    cases: int = 0


class PolicyService:
    """Evaluates policy inputs with the engine the config chose.

    `isolate=False` evaluates rego-cpp in this process. That is for the simulator,
    which evaluates many thousands of times against a known-good policy: the child
    round trip would dominate its run time, and an engine crash there ends one
    simulation rather than a service. The long-running server always isolates.
    """

    def __init__(
        self,
        config: PolicyConfig,
        *,
        clock: Clock | None = None,
        isolate: bool = True,
        teams: Collection[str] | None = None,
    ) -> None:
        self.config = config
        # The config's team names (`default` included): each load warns in the log of a
        # team the data names that is not among them (`data_teams`). None: not compared
        # (the simulator's teams come from its trace).
        self.teams = teams
        self.clock = clock or SystemClock()
        self.isolate = isolate
        self.directory = Path(config.dir) if config.dir else shipped_policy_dir()
        self.data_dir = Path(config.data_dir) if config.data_dir else None
        self._lock = threading.Lock()
        self._engine: EmbeddedEngine | OpaEngine
        self.loaded_at: datetime | None = None
        self.last_reload_at: datetime | None = None
        self.last_reload_error: str | None = None
        self.last_eval_error: str | None = None
        self.cases_passed = 0
        self._fingerprint = ""
        if config.engine == "opa":
            if not config.opa_url:
                raise ConfigError("policy.engine is 'opa' but policy.opa_url is not set: add the OPA server URL")
            self._engine = OpaEngine(config.opa_url, package=config.package, timeout_s=config.timeout_s)
            self.loaded_at = self.clock.now()
            return
        outcome, engine = self._prepare()
        if engine is None:
            raise PolicyError(f"policy directory {self.directory} cannot be put in force: {outcome.message}")
        self._engine = engine
        self.loaded_at = self.last_reload_at = self.clock.now()
        self.cases_passed = outcome.cases
        RELOAD_OK.set(1)

    # ------------------------------------------------------------ evaluation

    @property
    def revision(self) -> str:
        return self._engine.revision

    @property
    def engine(self) -> EmbeddedEngine | OpaEngine:
        return self._engine

    def evaluate(self, policy_input: PolicyInput) -> EvaluationResult:
        with self._lock:
            engine = self._engine
        result = engine.evaluate(policy_input)
        EVAL_SECONDS.observe(result.eval_ms / 1000)
        if result.error:
            EVAL_FAILURES.inc()
            self.last_eval_error = result.error
            log.error("policy evaluation failed safe (revision %s): %s", result.revision, result.error)
        return result

    # ------------------------------------------------------------ reload

    def _prepare(self) -> tuple[ReloadOutcome, EmbeddedEngine | None]:
        """Load, compile, lint and test the directory in a fresh engine."""
        self._fingerprint = self._current_fingerprint()
        try:
            bundle = load_bundle(self.directory, data_dir=self.data_dir)
        except PolicyError as exc:
            return ReloadOutcome(False, self._current_revision(), None, exc.message), None
        engine = EmbeddedEngine(
            bundle,
            package=self.config.package,
            timeout_s=self.config.timeout_s,
            isolate=self.isolate,
            interpreter=self.config.interpreter,
        )
        report = check_and_test(bundle, engine)
        if not report.ok:
            engine.close()
            return ReloadOutcome(False, self._current_revision(), bundle.revision, report.summary()), None
        if self.teams is not None:
            for note in undeclared_teams(bundle.data, bundle.sources, self.teams):
                log.warning("policy data (revision %s): %s", bundle.revision, note)
        return ReloadOutcome(True, bundle.revision, bundle.revision, report.summary(), len(report.results)), engine

    def _current_revision(self) -> str:
        engine = getattr(self, "_engine", None)
        return engine.revision if engine is not None else ""

    def reload(self) -> ReloadOutcome:
        """Check, test, then swap; on any failure keep the last good bundle."""
        self.last_reload_at = self.clock.now()
        if isinstance(self._engine, OpaEngine):
            return ReloadOutcome(True, self.revision, None, "OPA serves its own bundles; nothing to reload here")
        outcome, engine = self._prepare()
        if engine is None:
            self.last_reload_error = outcome.message
            RELOADS.labels(result="refused").inc()
            RELOAD_OK.set(0)
            log.error("policy reload refused; revision %s stays in force: %s", outcome.revision, outcome.message)
            return outcome
        with self._lock:
            old, self._engine = self._engine, engine
        old.close()
        self.loaded_at = self.clock.now()
        self.last_reload_error = None
        self.cases_passed = outcome.cases
        RELOADS.labels(result="ok").inc()
        RELOAD_OK.set(1)
        log.info("policy revision %s in force (%s)", outcome.revision, outcome.message)
        return outcome

    def check_for_changes(self) -> ReloadOutcome | None:
        """The file watch: reload when the directory changed since the last attempt."""
        if isinstance(self._engine, OpaEngine):
            return None
        if self._current_fingerprint() == self._fingerprint:
            return None
        return self.reload()

    def _current_fingerprint(self) -> str:
        # The data directory is watched too: FinOps edit budgets there.
        return directory_fingerprint(self.directory, *([self.data_dir] if self.data_dir else []))

    def status(self) -> dict[str, Any]:
        return {
            "engine": self.config.engine,
            "isolated": self.isolate if self.config.engine == "embedded" else None,
            "interpreter": self.config.interpreter if self.config.engine == "embedded" else None,
            "directory": str(self.directory) if self.config.engine == "embedded" else None,
            "data_dir": str(self.data_dir) if self.data_dir and self.config.engine == "embedded" else None,
            "opa_url": self.config.opa_url if self.config.engine == "opa" else None,
            "package": self.config.package,
            "revision": self.revision,
            "loaded_at": self.loaded_at,
            "last_reload_at": self.last_reload_at,
            "last_reload_error": self.last_reload_error,
            "last_eval_error": self.last_eval_error,
            "test_cases_passed": self.cases_passed,
        }

    def in_force(self) -> tuple[list[str], dict[str, Any] | None]:
        """The Rego modules and the data of the policy being evaluated (embedded only:
        with OPA, the bundle lives in OPA)."""
        bundle = getattr(self._engine, "bundle", None)
        if bundle is None:
            return [], None
        return sorted(bundle.modules), dict(bundle.data)

    def close(self) -> None:
        self._engine.close()
