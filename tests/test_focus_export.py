"""The FOCUS 1.0 export of a live loop passes the FinOps Foundation's own validator.

A reconciler with the fake provider and the shipped policy runs two teams' work on two
pools (one whose free capacity is `shared`, kept at a minimum of one machine) across a
month turn; the spend is accrued by the real ledger; `autoscaler spend --format focus`
exports each month through the real API; `focus-validator --validate-version 1.0`
checks each file. The validator lives in its own virtualenv under the user's cache
directory, installed by scripts/ensure-focus-validator.sh (it clashes with our
dependencies); the test skips only when that script cannot install it, saying why.
"""

from __future__ import annotations

import csv
import json
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from autoscaler.cli import _register, app
from autoscaler.clock import ManualClock
from autoscaler.config import parse_config
from autoscaler.ledger.spend import month_to_date
from autoscaler.policy.service import PolicyService
from autoscaler.provisioning import catalog_offerings
from autoscaler.reports.focus import COLUMNS, LEGACY_ALIASES, STRICT_COLUMNS, from_csv, total
from autoscaler.state.db import make_engine, session_factory, transaction
from autoscaler.state.models import Task
from providers.fake import FakeProvider
from tests.conftest import LiveServer, issue_token, make_context
from tests.reconciler.harness import Rig, make_rig, policy_service

REPO = Path(__file__).resolve().parents[1]
ENSURE = REPO / "scripts" / "ensure-focus-validator.sh"
MARCH = datetime(2026, 3, 1, tzinfo=UTC)
APRIL = datetime(2026, 4, 1, tzinfo=UTC)
runner = CliRunner()
_register()

CONFIG = """
deployment: focus-test
teams:
  - {name: vision}
  - {name: nlp}
queues:
  - {name: gpu, pools: [gpu-pool], priority: 10}
  - {name: cpu, pools: [cpu-pool]}
pools:
  - name: gpu-pool
    provider: fake
    region: us-east-1
    max_instances: 4
    instance_types: [{name: g.1, gpus: 1, gpu_type: A10G, cpus: 4, memory_mb: 16000, on_demand_price: 1.0, spot_price: 0.4}]
  - name: cpu-pool
    provider: fake
    region: us-west-2
    min_instances: 1
    unused_cost: shared
    capacity_types: [on_demand]
    instance_types: [{name: c.1, gpus: 0, cpus: 2, memory_mb: 4000, on_demand_price: 0.1}]
"""


@dataclass(frozen=True)
class Validator:
    executable: Path

    def run(self, data: Path, tmp: Path) -> tuple[int, list[str], str]:
        """(rules checked, failed rule names, console tail) for one export file."""
        report = tmp / f"{data.stem}-report.xml"
        # focus-validator 1.0.0 opens its ISO 4217 list by a path relative to the working
        # directory (focus_validator/utils/currency_codes.csv): run it from site-packages.
        site = subprocess.run(
            [str(self.executable.parent / "python"), "-c", "import focus_validator, os; "
             "print(os.path.dirname(os.path.dirname(focus_validator.__file__)))"],
            capture_output=True, text=True, check=True, timeout=120,
        ).stdout.strip()  # fmt: skip
        proc = subprocess.run(
            [
                str(self.executable),
                "--data-file", str(data),
                "--column-namespace", "x",
                "--validate-version", "1.0",
                "--output-type", "unittest",
                "--output-destination", str(report),
            ],
            cwd=site, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        tail = (proc.stdout + proc.stderr)[-3000:]
        assert proc.returncode == 0 and report.exists(), f"focus-validator did not run: {tail}"
        root = ET.parse(report).getroot()
        failed = [
            case.get("name", "?")
            for case in root.iter("testcase")
            if case.find("failure") is not None or case.find("error") is not None
        ]
        return int(root.get("tests", "0")), failed, tail


@pytest.fixture(scope="session")
def focus_validator() -> Validator:
    try:
        proc = subprocess.run(["bash", str(ENSURE)], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        pytest.skip("scripts/ensure-focus-validator.sh did not finish installing focus-validator in 15 min")
    if proc.returncode != 0:
        pytest.skip(f"scripts/ensure-focus-validator.sh could not install focus-validator: {proc.stderr[-800:]}")
    return Validator(Path(proc.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def shipped_policy() -> Iterator[PolicyService]:
    svc = policy_service()
    yield svc
    svc.close()


@pytest.fixture
def loop(sqlite_url: str, shipped_policy: PolicyService) -> Iterator[tuple[Rig, LiveServer]]:
    engine = make_engine(sqlite_url)
    sessions: sessionmaker[Session] = session_factory(engine)
    config = parse_config(CONFIG, Path("focus-test.yaml"))
    clock = ManualClock(datetime(2026, 3, 31, 21, 0, tzinfo=UTC))
    rig = make_rig(sessions, config, clock, shipped_policy)
    # Two fake clouds: distinct instance ids, as two real accounts would have.
    cpu = next(p for p in config.pools if p.name == "cpu-pool")
    rig.fakes["cpu-pool"] = FakeProvider(
        catalog_offerings(cpu), name="fake:cpu-pool", clock=clock.now, id_prefix="fake-cpu-"
    )
    server = LiveServer(make_context(config, sessions, clock)).start()
    yield rig, server
    server.stop()
    engine.dispose()


def _run_across_the_month_turn(rig: Rig) -> None:
    """vision's GPU task and nlp's CPU task run from 21:00 on March 31 to 01:30 on
    April 1; the machines then idle out and drain. The cpu pool keeps one machine."""
    r = rig.reconciler()
    gpu_task = rig.enqueue("vision", gpus=1, queue="gpu")
    cpu_task = rig.enqueue("nlp", gpus=0, queue="cpu")
    r.run_cycle()
    workers: dict[str, str] = {}
    for inst in rig.instances():
        assert inst.state == "booting", (inst.pool, inst.state)
        workers[inst.id] = rig.register(inst, gpus=inst.gpus)
    rig.clock.advance(60)
    r.run_cycle()
    leased = {t for w in workers.values() if (t := rig.lease(w))}
    assert {gpu_task, cpu_task} <= leased
    # Four and a half hours of work, a cycle (and a heartbeat) every ten minutes.
    for _ in range(27):
        rig.clock.advance(600)
        for w in workers.values():
            rig.heartbeat(w)
        r.run_cycle()
    with rig.sessions() as s:
        running = {t.id: t.worker_id for t in s.scalars(select(Task).where(Task.id.in_([gpu_task, cpu_task])))}
    for task_id, worker_id in running.items():
        assert worker_id, f"task {task_id} lost its worker"
        rig.finish(worker_id, task_id)
    # Idle past the timeout: drained and gone (the cpu pool's minimum stays).
    for _ in range(3):
        rig.clock.advance(301)
        for w in workers.values():
            if rig.worker(w).state != "draining":
                rig.heartbeat(w)
        r.run_cycle()
        for w in workers.values():
            if rig.worker(w).state == "draining":
                rig.leave(w)
    r.run_cycle()


def _server(server: LiveServer, token: str) -> list[str]:
    return ["--server", server.url, "--token", token]


def _export(server: LiveServer, token: str, month: str, out: Path, *extra: str) -> list[dict[str, object]]:
    result = runner.invoke(
        app,
        ["spend", "--format", "focus", "--month", month, "--output", str(out), *extra, *_server(server, token)],
    )
    assert result.exit_code == 0, result.output
    text = out.read_text()
    return from_csv(text)


def _ledger(rig: Rig, at: datetime, team: str | None = None) -> float:
    with transaction(rig.sessions) as s:
        return sum(month_to_date(s, at, team=team).values())


def test_live_loop_export_passes_focus_validator(
    loop: tuple[Rig, LiveServer], focus_validator: Validator, tmp_path: Path
) -> None:
    rig, server = loop
    _run_across_the_month_turn(rig)
    admin = issue_token(server.ctx, "admin")
    march = _export(server, admin, "2026-03", tmp_path / "focus-2026-03.csv")
    april = _export(server, admin, "2026-04", tmp_path / "focus-2026-04.csv")

    # The export is the ledger: each month sums to the ledger's total for it.
    assert march and april
    assert total(march) == pytest.approx(_ledger(rig, MARCH), abs=1e-5)
    assert total(april) == pytest.approx(_ledger(rig, APRIL), abs=1e-5)
    # Several sub-accounts (the two teams and the cpu pool's shared line), two pools,
    # spot and on-demand, usage and unused.
    assert {r["SubAccountId"] for r in march} == {"vision", "nlp", "shared"}
    assert {r["x_Pool"] for r in march} == {"gpu-pool", "cpu-pool"}
    assert {r["PricingCategory"] for r in march} == {"Dynamic", "Standard"}
    assert {r["x_CostKind"] for r in march} == {"usage", "unused"}
    for rows, start, end in ((march, "2026-03-01", "2026-04-01"), (april, "2026-04-01", "2026-05-01")):
        for r in rows:
            assert (r["BillingPeriodStart"], r["BillingPeriodEnd"]) == (f"{start}T00:00:00Z", f"{end}T00:00:00Z")
            assert start <= str(r["ChargePeriodStart"]) < str(r["ChargePeriodEnd"]) <= f"{end}T00:00:00Z"
            assert r["BillingAccountId"] == "focus-test" and r["SubAccountName"] == r["SubAccountId"]
            assert r["BilledCost"] == r["EffectiveCost"] == r["ContractedCost"]
            assert r["ServiceCategory"] == "Compute" and r["ChargeCategory"] == "Usage"
            for alias, column in LEGACY_ALIASES.items():
                assert r[alias] == r[column]
            assert json.loads(str(r["Tags"]))["team"] == r["x_Team"]
    # The month turn: the GPU machine's segments meet at midnight.
    gpu_march = [r for r in march if r["x_Pool"] == "gpu-pool" and r["x_CostKind"] == "usage"]
    gpu_april = [r for r in april if r["x_Pool"] == "gpu-pool" and r["x_CostKind"] == "usage"]
    assert [r["ChargePeriodEnd"] for r in gpu_march] == ["2026-04-01T00:00:00Z"]
    assert [r["ChargePeriodStart"] for r in gpu_april] == ["2026-04-01T00:00:00Z"]
    # List vs contracted: the spot GPU machine lists at its on-demand price.
    (spot,) = gpu_march
    assert (spot["ListUnitPrice"], spot["ContractedUnitPrice"]) == (1.0, 0.4)
    assert spot["ListCost"] == pytest.approx(spot["PricingQuantity"] * 1.0, abs=1e-5)  # type: ignore[operator]
    assert spot["ContractedCost"] == pytest.approx(spot["PricingQuantity"] * 0.4, abs=1e-5)  # type: ignore[operator]
    assert spot["RegionId"] == "us-east-1" and spot["AvailabilityZone"] is None

    # One team's export holds that team's rows only.
    vision = _export(server, admin, "2026-03", tmp_path / "vision-2026-03.csv", "--team", "vision")
    assert {r["SubAccountId"] for r in vision} == {"vision"}
    assert total(vision) == pytest.approx(_ledger(rig, MARCH, "vision"), abs=1e-5)

    for path in (tmp_path / "focus-2026-03.csv", tmp_path / "focus-2026-04.csv"):
        checked, failed, tail = focus_validator.run(path, tmp_path)
        assert checked >= 100, f"{path.name}: the validator checked only {checked} rules: {tail}"
        assert not failed, f"{path.name}: focus-validator 1.0 failed {failed}: {tail}"
    # A control: the same harness catches a broken export (a required column missing).
    with (tmp_path / "focus-2026-03.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    broken = tmp_path / "broken.csv"
    with broken.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[c for c in COLUMNS if c != "BillingAccountId"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    _, failed, tail = focus_validator.run(broken, tmp_path)
    assert any(name.startswith("BillingAccountId_Required") for name in failed), (failed, tail)


def test_strict_export_has_only_focus_and_extension_columns(loop: tuple[Rig, LiveServer], tmp_path: Path) -> None:
    rig, server = loop
    r = rig.reconciler()
    rig.enqueue("vision", gpus=1, queue="gpu")
    r.run_cycle()
    rig.clock.advance(3600)
    r.run_cycle()
    admin = issue_token(server.ctx, "admin")
    out = tmp_path / "strict.csv"
    _export(server, admin, "2026-03", out, "--strict")
    header = out.read_text().splitlines()[0].split(",")
    assert header == STRICT_COLUMNS
    assert all(c in COLUMNS for c in header) and not set(LEGACY_ALIASES) & set(header)
    assert all(not c.startswith("x_") or c[2:3].isupper() for c in header)


def test_parquet_needs_pyarrow_or_writes_typed_columns(loop: tuple[Rig, LiveServer], tmp_path: Path) -> None:
    rig, server = loop
    r = rig.reconciler()
    rig.enqueue("vision", gpus=1, queue="gpu")
    r.run_cycle()
    rig.clock.advance(1800)
    r.run_cycle()
    admin = issue_token(server.ctx, "admin")
    out = tmp_path / "focus.parquet"
    result = runner.invoke(
        app,
        ["spend", "--format", "focus", "--month", "2026-03", "--output", str(out), *_server(server, admin)],
    )
    try:
        import pyarrow.parquet as pq  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        assert result.exit_code != 0 and "Parquet output needs pyarrow" in result.output, result.output
        assert not out.exists()
        return
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    assert table.column_names == COLUMNS
    assert str(table.schema.field("BilledCost").type) == "double"
    assert str(table.schema.field("ChargePeriodStart").type) == "timestamp[ms, tz=UTC]"
    assert sum(table.column("BilledCost").to_pylist()) == pytest.approx(_ledger(rig, MARCH), abs=1e-5)


def test_bad_month_and_parquet_without_focus_are_refused(tmp_path: Path) -> None:
    bad = runner.invoke(app, ["spend", "--format", "focus", "--month", "2026-13", "--server", "http://127.0.0.1:9"])
    assert bad.exit_code != 0 and "YYYY-MM" in str(bad.exception)
    table = runner.invoke(
        app, ["spend", "--format", "table", "--output", str(tmp_path / "x.parquet"), "--server", "http://127.0.0.1:9"]
    )
    assert table.exit_code != 0 and "--format focus" in table.output
