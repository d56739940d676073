"""Benchmark: enqueue -> launch request latency on the local loop (`autoscaler up` with the
example config and the local provider: a real server process, real agent processes).

Each sample enqueues one 2-GPU task (one whole `local.2gpu` instance) and waits for the
instance the reconciler records for it. Reported per sample, from the server's own
timestamps: task created -> launch intent committed (`instances.created_at`), and task
created -> the provider's launch call returned (`instances.launched_at`). Samples are
spaced by `--gap` seconds so that each one waits for its own debounced wake.

    .venv/bin/python bench/enqueue_to_launch.py --samples 15
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--gap", type=float, default=2.5)
    args = ap.parse_args()
    cfg = yaml.safe_load((REPO / "examples" / "local.yaml").read_text())
    port = free_port()
    cfg["server"]["port"] = port
    cfg["pools"][0]["max_instances"] = args.samples + 1
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        (Path(tmp) / "cfg.yaml").write_text(yaml.safe_dump(cfg))
        env = {**os.environ, "AUTOSCALER_HOME": str(home)}
        log = (Path(tmp) / "up.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "autoscaler", "up", "-c", str(Path(tmp) / "cfg.yaml")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(120):
                try:
                    if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.25)
            api = httpx.Client(
                base_url=base,
                timeout=10,
                headers={"Authorization": f"Bearer {(home / 'admin.token').read_text().strip()}"},
            )
            intent_ms, launched_ms = [], []
            seen: set[str] = set()
            for _ in range(args.samples):
                task = api.post(
                    "/api/v1/tasks",
                    json={
                        "queue": "gpu",
                        "gpus": 2,
                        "team": "vision",
                        "command": [sys.executable, "-c", "import time; time.sleep(60)"],
                    },
                ).json()
                deadline = time.monotonic() + 60
                new = None
                while time.monotonic() < deadline and new is None:
                    rows = api.get("/api/v1/instances", params={"include_terminated": True}).json()
                    new = next((r for r in rows if r["id"] not in seen and r.get("launched_at")), None)
                    time.sleep(0.05)
                if new is None:
                    raise SystemExit("no launch within 60 s; see the server log")
                seen.add(new["id"])
                created = ts(task["created_at"])
                intent_ms.append((ts(new["created_at"]) - created).total_seconds() * 1000)
                launched_ms.append((ts(new["launched_at"]) - created).total_seconds() * 1000)
                time.sleep(args.gap)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    print(f"samples={args.samples} (debounce 1 s, interval 15 s, example config)")
    for name, values in (("enqueue -> intent", intent_ms), ("enqueue -> launched", launched_ms)):
        print(
            f"{name:<22} median {statistics.median(values):7.0f} ms   max {max(values):7.0f} ms   "
            f"min {min(values):7.0f} ms"
        )


if __name__ == "__main__":
    main()
