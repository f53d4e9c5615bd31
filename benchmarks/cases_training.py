"""A training step in the loop: what the loader costs a model training on the same GPU.

Each case builds a small model of matrix products (the batch's features through
``depth`` square ``width x width`` layers, forward and backward, with a plain SGD update)
and sizes ``depth`` so that one step takes about ``STEP_MS`` on its own. In the case's
process it first times the step alone, on a batch already on the GPU (recorded as the
facts ``step_ms_alone``, ``depth`` and ``width``), then every epoch trains one step per
batch that ``TorchAsyncItr`` delivers, synchronising only at the end of the epoch, as a
training loop does. A later epoch's time per step against ``step_ms_alone`` is what the
loader costs under training (``gpu_goals.py`` derives it): with the loader's work
overlapped, a step fed by the loader takes the longer of the two, not their sum.

Two feeds, at the smallest size: the GPU backend (``TorchAsyncItr(device="cuda")``),
and the path without cudf (``backend="cpu"``, pinned staging).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from typing import Any

try:
    from common import Case, Context, fact, loader_facts
except ImportError:  # imported as part of a package
    from benchmarks.common import Case, Context, fact, loader_facts

STEP_MS = 4.0
"""The step's time alone on a GPU: about what the loader spends on a batch of 65,536
rows at 15M rows/s, so that waiting on each other shows."""
WIDTH = 1024
TRAIN_GPU = "training step fed by TorchAsyncItr(device='cuda') (shuffle)"
TRAIN_CPU = "training step fed by TorchAsyncItr(device='cuda', backend='cpu') (shuffle)"


def cases(ctx: Context) -> list[Case]:
    if ctx.device != "cuda" or not ctx.gpu or importlib.util.find_spec("torch") is None:
        return []
    return [
        Case(TRAIN_GPU, _training(ctx, "gpu"), group="training", every_size=False),
        Case(TRAIN_CPU, _training(ctx, "cpu"), group="training", every_size=False),
    ]


class MatmulModel:
    """``depth`` ReLU layers of ``width x width`` over the batch's features, a linear
    output, squared error, SGD: a step is a forward and backward pass and an update."""

    def __init__(self, features: int, width: int, device: str) -> None:
        import torch

        generator = torch.Generator().manual_seed(0)

        def weight(rows: int, cols: int) -> Any:
            w = torch.randn(rows, cols, generator=generator) / rows**0.5
            return w.to(device).requires_grad_()

        self.device = device
        self.params = [weight(features, width), weight(width, width), weight(width, 1)]
        self.depth = 1

    def step(self, x_cat: Any, x_cont: Any, y: Any) -> None:
        import torch

        w_in, w, w_out = self.params
        x = torch.cat([x_cont, x_cat.to(x_cont.dtype) * 1e-6], dim=1)
        h = x @ w_in
        for _ in range(self.depth):
            h = torch.relu(h @ w)
        loss = ((h @ w_out).reshape(-1) - y.reshape(-1)).square().mean()
        loss.backward()
        with torch.no_grad():
            for p in self.params:
                p -= 1e-3 * p.grad
                p.grad = None

    def synchronize(self) -> None:
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)

    def time_steps(self, batch: tuple[Any, Any, Any], steps: int) -> float:
        """Seconds per step, ``steps`` steps on one resident batch."""
        self.synchronize()
        started = time.perf_counter()
        for _ in range(steps):
            self.step(*batch)
        self.synchronize()
        return (time.perf_counter() - started) / steps


def _training(ctx: Context, backend: str) -> Callable[[], Callable[[], int]]:
    def make() -> Callable[[], int]:
        import torch

        import tabloader
        from cases_gpu import torch_device
        from tabloader.torch import DLDataLoader, TorchAsyncItr

        target = torch_device(ctx)
        on_gpu = target.startswith("cuda")
        if on_gpu:  # TF32, as training runs on a GPU (the case's own process)
            torch.set_float32_matmul_precision("high")
        width = WIDTH if on_gpu else 32  # PyTorch on the CPU: the emulated device, in CI
        model = MatmulModel(len(ctx.cats) + len(ctx.conts), width, target)
        rows = ctx.batch_size
        resident = (
            torch.randint(0, 1000, (rows, len(ctx.cats)), device=target),
            torch.rand(rows, len(ctx.conts), device=target),
            torch.rand(rows, device=target),
        )
        model.depth = 4
        model.time_steps(resident, 3)  # warm-up: kernels chosen, memory pooled
        per_step = model.time_steps(resident, 10)
        model.depth = max(1, min(64, round(4 * STEP_MS / 1e3 / per_step)))
        steps = -(-ctx.rows // ctx.batch_size)
        model.time_steps(resident, 3)
        fact("width", width)
        fact("depth", model.depth)
        fact("step_ms_alone", 1e3 * model.time_steps(resident, steps))

        dataset = TorchAsyncItr(
            tabloader.Dataset(ctx.files),
            **ctx.loader_options,
            seed=0,
            shuffle=True,
            device="cuda" if backend == "gpu" else target,
            backend=backend,
        )
        batches = DLDataLoader(dataset, batch_size=None, collate_fn=lambda b: b, num_workers=0)

        def run() -> int:
            delivered = steps = 0
            for x_cat, x_cont, y in batches:
                model.step(x_cat, x_cont, y)
                delivered += len(y)
                steps += 1
            model.synchronize()
            fact("steps_per_epoch", steps)
            loader_facts(dataset.loader)
            return delivered

        return run

    return make
