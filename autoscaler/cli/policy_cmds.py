"""`autoscaler policy check|test|eval|schema`: work on a policy directory before it
is put in force. These run the embedded engine in this process (a CLI run is the
only thing an engine crash could end) and need no server. `autoscaler policy show`
asks the running server which policy is in force."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.text import Text

from autoscaler.cli import app
from autoscaler.cli.common import HomeOpt, JsonOpt, ServerOpt, TokenOpt, client, out, print_json
from autoscaler.config import load_config, read_environment
from autoscaler.errors import InvalidInput
from autoscaler.policy.bundle import load_bundle, shipped_policy_dir
from autoscaler.policy.cases import check, check_and_test, complete_input
from autoscaler.policy.data_teams import undeclared_teams
from autoscaler.policy.engines import EmbeddedEngine
from autoscaler.policy.problems import PolicyError
from autoscaler.policy.schema import export_schemas
from autoscaler.sdk.errors import SdkError

policy_app = typer.Typer(help="Check, test and evaluate Rego policies.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")

DirArg = Annotated[Path, typer.Argument(help="Policy directory (*.rego, data/, tests/).")]
PackageOpt = Annotated[str, typer.Option("--package", help="Rego package whose `decision` is evaluated.")]
DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Data files that replace DIR/data's of the same name (a deployment's policy.data_dir).",
    ),
]

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="autoscaler.yaml (env AUTOSCALER_CONFIG): warn of teams the data names that its teams: lack; "
        "its policy.data_dir is the default --data-dir.",
    ),
]


def _engine(
    directory: Path, package: str, *, with_cases: bool, data_dir: Path | None = None
) -> tuple[Any, EmbeddedEngine]:
    try:
        bundle = load_bundle(directory, with_cases=with_cases, data_dir=data_dir)
    except PolicyError as exc:
        if not exc.problems:
            raise
        # One line per problem (a data file against its schema can have many), then
        # the count as the error that ends the command.
        for p in exc.problems:
            out.print(Text(str(p), style="red"))
        summary = exc.message.split(": ", 1)[0] if ": " in exc.message else exc.message
        raise PolicyError(f"{len(exc.problems)} problem(s) in {directory}: {summary}") from None
    return bundle, EmbeddedEngine(bundle, package=package, isolate=False)


@policy_app.command("check")
def check_cmd(
    directory: DirArg, package: PackageOpt = "autoscaler", data_dir: DataDirOpt = None, config: ConfigOpt = None
) -> None:
    """Compile the policies and flag what the engine would accept too leniently."""
    settings = read_environment()
    cfg = load_config(config, settings) if (config or settings.config) else None
    if data_dir is None and cfg is not None and cfg.policy.data_dir:
        data_dir = Path(cfg.policy.data_dir)  # the data the deployment loads
    bundle, engine = _engine(directory, package, with_cases=False, data_dir=data_dir)
    problems = check(bundle, engine)
    for p in problems:
        out.print(str(p), style="red")
    if problems:
        raise PolicyError(f"{len(problems)} problem(s) in {directory}")
    # Warned, not refused: the data may serve other deployments too (docs/policies.md).
    for note in undeclared_teams(bundle.data, bundle.sources, cfg.team_names()) if cfg is not None else []:
        out.print(Text(f"warning: {note}", style="yellow"))
    out.print(f"ok: {len(bundle.modules)} module(s), revision {bundle.revision}")


@policy_app.command("test")
def test_cmd(directory: DirArg, package: PackageOpt = "autoscaler", data_dir: DataDirOpt = None) -> None:
    """Run the table-driven cases in DIR/tests/*.yaml through the real engine."""
    bundle, engine = _engine(directory, package, with_cases=True, data_dir=data_dir)
    report = check_and_test(bundle, engine)
    for p in report.problems:
        out.print(str(p), style="red")
    if report.problems:
        raise PolicyError(f"{len(report.problems)} problem(s) in {directory}; no test case was run")
    if not report.results:
        raise PolicyError(f"no test cases in {directory}/tests/*.yaml: add some (see docs/policies.md)")
    for r in report.results:
        if r.passed:
            out.print(Text.assemble(("PASS", "green"), f" {r.case.file}: {r.case.name}"))
        else:
            out.print(Text.assemble(("FAIL", "red"), f" {r.case.file}: {r.case.name}"))
            for f in r.failures:
                out.print(f"       {f}")
    failed = sum(not r.passed for r in report.results)
    if failed:
        raise PolicyError(f"{failed} of {len(report.results)} test case(s) failed")
    out.print(f"{len(report.results)} passed (revision {bundle.revision})")


@policy_app.command("eval")
def eval_cmd(
    input_file: Annotated[Path, typer.Option("--input", help="Policy input, JSON or YAML.")],
    directory: Annotated[Path | None, typer.Option("--dir", help="Policy directory; default: the shipped one.")] = None,
    package: PackageOpt = "autoscaler",
    data_dir: DataDirOpt = None,
) -> None:
    """Print the decision the policies give for one input."""
    try:
        raw = yaml.safe_load(input_file.read_text())
    except OSError as exc:
        raise InvalidInput(f"{input_file}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{input_file}: not valid JSON or YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise InvalidInput(f"{input_file}: the input must be a mapping (see docs/schemas/policy-input.v1.json)")
    policy_input = complete_input(raw)
    _, engine = _engine(directory or shipped_policy_dir(), package, with_cases=False, data_dir=data_dir)
    problems = engine.compile()
    if problems:
        raise PolicyError("the policy does not compile", problems)
    result = engine.evaluate(policy_input)
    if result.error:
        raise PolicyError(f"evaluation failed: {result.error}")
    print_json(
        {
            "revision": result.revision,
            "input_digest": result.input_digest,
            "eval_ms": round(result.eval_ms, 3),
            "decision": result.decision.model_dump(mode="json"),
        }
    )


@policy_app.command("schema")
def schema_cmd(
    out_dir: Annotated[Path, typer.Option("--out", help="Write the JSON Schemas here.")] = Path("docs/schemas"),
) -> None:
    """Export the JSON Schemas of the policy input and decision."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, schema in export_schemas().items():
        (out_dir / name).write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        out.print(f"wrote {out_dir / name}")


@policy_app.command("show")
def show(
    server: ServerOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The policy in force on the server: engine, directory, revision, modules, test
    cases passed, the last errors, and (admins) its data."""
    try:
        status = client(server, token, home).get("/api/v1/policy")
    except SdkError as exc:
        if exc.status == 404:  # `autoscaler server`: the API without the policy service
            raise SdkError(
                "the policy service is not running in this process: `autoscaler server` serves the API only; "
                "`autoscaler up` runs the policy service (see its status there)"
            ) from None
        raise
    if json_out:
        print_json(status)
        return
    where = status["directory"] or status["opa_url"] or "-"
    out.print(Text.assemble(("policy in force: ", "bold"), f"revision {status['revision'] or '-'}"))
    out.print(f"engine: {status['engine']}  package: {status['package']}  from: {where}")
    out.print(f"loaded: {status['loaded_at'] or '-'}  test cases passed: {status['test_cases_passed']}")
    if status.get("modules"):
        out.print("modules: " + ", ".join(status["modules"]))
    for label, key in (("last reload refused", "last_reload_error"), ("last evaluation failed", "last_eval_error")):
        if status.get(key):
            out.print(Text.assemble((f"{label}: ", "bold red"), str(status[key])))
    if status.get("data") is not None:
        out.print("data:")
        out.print(Text(yaml.safe_dump(status["data"], sort_keys=True, default_flow_style=False).rstrip()))
