"""Runs the Rego engine in a child process so its crash or hang cannot take the service down.

Both interpreters are native code (rego-cpp C++, regorus Rust); some inputs made
rego-cpp crash (SIGSEGV) and a runaway policy can loop for ever in either. The child
(`python -m autoscaler.policy.isolation <interpreter>`) speaks JSON lines: one request
on stdin, one answer on a private copy of stdout (the real fd 1 is pointed at stderr
so the engine's printf diagnostics cannot corrupt the protocol). An evaluation sends
the input as a second line of JSON text that the child hands to the engine as it is:
decoding it into Python objects only to encode it again cost more than the policy.

The parent waits at most `timeout_s` per request. On a timeout it kills the child; on a
crash it notices EOF. Either way the request fails (the caller fails safe) and the next
request starts a fresh child and reloads the last bundle into it. The round trip costs
a fraction of a millisecond plus JSON encoding of the input (see docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any

from autoscaler.policy.interpreters import DEFAULT_INTERPRETER, make_runtime
from autoscaler.policy.problems import Problem
from autoscaler.policy.rego import RegoFailure

START_TIMEOUT_S = 30.0


class EngineUnavailable(Exception):
    """The child crashed, hung or could not start; the message says which."""


def _problems_to_json(problems: list[Problem]) -> list[dict[str, Any]]:
    return [{"file": p.file, "line": p.line, "col": p.col, "message": p.message} for p in problems]


def _problems_from_json(items: list[dict[str, Any]]) -> list[Problem]:
    return [Problem(i["file"], i.get("line"), i["message"], i.get("col")) for i in items]


def child_main() -> None:  # pragma: no cover - runs in the child; exercised by tests through the pipe
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # One thread serves every request here, so the engine needs no owner thread.
    runtime = make_runtime(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_INTERPRETER, same_thread=True)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "load":
                runtime.load(req["modules"], req["data"], req["entrypoint"])
                resp: dict[str, Any] = {"ok": True}
            elif op == "eval":
                value, eval_ms = runtime.evaluate_text(sys.stdin.readline())
                resp = {"ok": True, "value": value, "eval_ms": eval_ms}
            elif op == "unknown_functions":
                resp = {"ok": True, "value": runtime.unknown_functions(req["names"])}
            elif op == "sleep":  # lets tests hold the child busy
                time.sleep(float(req["seconds"]))
                resp = {"ok": True}
            else:
                resp = {
                    "ok": False,
                    "problems": _problems_to_json([Problem("(engine)", None, f"unknown op {op}")]),
                }
        except RegoFailure as exc:
            resp = {"ok": False, "problems": _problems_to_json(exc.problems)}
        except Exception as exc:
            resp = {"ok": False, "problems": _problems_to_json([Problem("(engine)", None, repr(exc))])}
        proto.write(json.dumps(resp) + "\n")


class IsolatedRego:
    """The parent side: same operations as a Runtime (interpreters.py), each bounded by a timeout."""

    def __init__(self, timeout_s: float, interpreter: str = DEFAULT_INTERPRETER) -> None:
        self.timeout_s = timeout_s
        self.interpreter = interpreter
        self._proc: subprocess.Popen[bytes] | None = None
        self._loaded: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc and self._proc.poll() is None else None

    def _start(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "autoscaler.policy.isolation", self.interpreter],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self._proc = proc
        if self._loaded is not None:
            self.restarts += 1
            # A fresh child after a crash: put the last good bundle back before serving.
            self._roundtrip(proc, self._loaded, START_TIMEOUT_S)
        return proc

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream:
                stream.close()

    def _roundtrip(
        self, proc: subprocess.Popen[bytes], req: dict[str, Any], timeout_s: float, payload: str | None = None
    ) -> dict[str, Any]:
        stdin: IO[bytes] | None = proc.stdin
        stdout: IO[bytes] | None = proc.stdout
        assert stdin is not None and stdout is not None
        message = json.dumps(req).encode() + b"\n"
        if payload is not None:
            # json.dumps escapes newlines inside strings, so the payload is exactly one line.
            message += payload.encode() + b"\n"
        try:
            stdin.write(message)
            stdin.flush()
        except (BrokenPipeError, OSError):
            self._kill()
            raise EngineUnavailable("the policy engine process exited unexpectedly") from None
        deadline = time.monotonic() + timeout_s
        buf = b""
        fd = stdout.fileno()
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            if not ready:
                self._kill()
                raise EngineUnavailable(f"the policy engine did not answer within {timeout_s:g} s; it was restarted")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                code = proc.wait()
                self._proc = None
                how = f"signal {-code}" if code < 0 else f"exit code {code}"
                raise EngineUnavailable(f"the policy engine process crashed ({how}); it will be restarted")
            buf += chunk
        resp: dict[str, Any] = json.loads(buf)
        return resp

    def request(self, req: dict[str, Any], timeout_s: float | None = None, payload: str | None = None) -> Any:
        """Send one request; returns its value, raises RegoFailure or EngineUnavailable."""
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                proc = self._start()
            resp = self._roundtrip(proc, req, timeout_s or self.timeout_s, payload)
        if not resp.get("ok"):
            raise RegoFailure(_problems_from_json(resp.get("problems", [])))
        return resp.get("value"), resp.get("eval_ms")

    def load(self, modules: dict[str, str], data: dict[str, Any], entrypoint: str) -> None:
        req = {"op": "load", "modules": modules, "data": data, "entrypoint": entrypoint}
        self.request(req, max(self.timeout_s, START_TIMEOUT_S))
        self._loaded = req

    def evaluate(self, policy_input: dict[str, Any]) -> tuple[Any, float]:
        return self.evaluate_text(json.dumps(policy_input))

    def evaluate_text(self, input_text: str) -> tuple[Any, float]:
        """`input_text` must be one line of JSON (json.dumps writes no raw newline)."""
        value, eval_ms = self.request({"op": "eval"}, payload=input_text)
        return value, float(eval_ms or 0.0)

    def unknown_functions(self, names: list[str]) -> list[str]:
        value, _ = self.request({"op": "unknown_functions", "names": names}, max(self.timeout_s, START_TIMEOUT_S))
        return list(value)

    def close(self) -> None:
        with self._lock:
            self._kill()


if __name__ == "__main__":  # pragma: no cover
    child_main()
