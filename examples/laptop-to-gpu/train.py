"""A training script that sends itself to a GPU worker: `python train.py --epochs 3`.

Run on your machine, `run_remotely` enqueues this same file with the same arguments
on the `gpu` queue, prints the task id and exits; on the worker it returns and the
training below runs there. See docs/laptop-to-gpu.md.

It needs nothing but the standard library (and uses PyTorch when the worker has it),
so it runs as is on the simulated GPUs of `make run`.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import socket

from autoscaler.sdk import run_remotely

# Everything above this line runs on both sides; keep it cheap and free of side effects.
run_remotely(queue="gpu", gpus=1, follow=os.environ.get("FOLLOW") == "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()
    print(
        f"task {os.environ['AUTOSCALER_TASK_ID']} on {socket.gethostname()}, "
        f"GPUs {os.environ.get('CUDA_VISIBLE_DEVICES')!r}",
        flush=True,
    )
    try:
        import torch  # type: ignore[import-not-found]

        print(f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}", flush=True)
    except ImportError:
        print("no torch on this worker: a pure-Python model stands in", flush=True)
    # Fit y = 3x + 1 by gradient descent: enough to show a loss going down.
    rng = random.Random(0)
    data = [(x, 3 * x + 1 + rng.gauss(0, 0.1)) for x in (rng.uniform(-1, 1) for _ in range(256))]
    w = b = 0.0
    loss = float("nan")
    for epoch in range(1, args.epochs + 1):
        gw = sum(2 * (w * x + b - y) * x for x, y in data) / len(data)
        gb = sum(2 * (w * x + b - y) for x, y in data) / len(data)
        w, b = w - args.lr * gw, b - args.lr * gb
        loss = sum((w * x + b - y) ** 2 for x, y in data) / len(data)
        print(f"epoch {epoch}/{args.epochs} loss {loss:.4f}", flush=True)
    print(f"done: w={w:.2f} b={b:.2f} (rmse {math.sqrt(loss):.3f})", flush=True)


if __name__ == "__main__":
    main()
