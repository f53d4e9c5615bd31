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

Four feeds, at the smallest size: the GPU backend streaming
(``TorchAsyncItr(device="cuda")``) and from a cache in GPU memory (``cache="memory"``),
the path without cudf (``backend="cpu"``, pinned staging), and a jitted JAX step of the
same matrix products fed by ``JaxLoader(device="cuda")`` (its depth sized the same way,
its step timed alone on a resident batch).
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
TRAIN_GPU_CACHED = "training step fed by TorchAsyncItr(device='cuda', cache='memory') (shuffle)"
TRAIN_CPU = "training step fed by TorchAsyncItr(device='cuda', backend='cpu') (shuffle)"
TRAIN_JAX = "training step fed by JaxLoader(device='cuda') (shuffle)"


def cases(ctx: Context) -> list[Case]:
    if ctx.device != "cuda" or not ctx.gpu:
        return []
    found: list[Case] = []
    if importlib.util.find_spec("torch") is not None:
        found += [
            Case(TRAIN_GPU, _training(ctx, "gpu"), group="training", every_size=False),
            Case(
                TRAIN_GPU_CACHED,
                _training(ctx, "gpu", cache="memory"),
                group="training",
                every_size=False,
                epochs=4,  # the cache filled, then placed, then two steady epochs
            ),
            Case(TRAIN_CPU, _training(ctx, "cpu"), group="training", every_size=False),
        ]
    if importlib.util.find_spec("jax") is not None:
        found.append(Case(TRAIN_JAX, _jax_training(ctx), group="training", every_size=False))
    return found


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


def _training(
    ctx: Context, backend: str, cache: str | None = None
) -> Callable[[], Callable[[], int]]:
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
            cache=cache,
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


def _jax_training(ctx: Context) -> Callable[[], Callable[[], int]]:
    """The same matrix products as `MatmulModel`, one jitted JAX step a batch of
    ``JaxLoader(device="cuda")``; its depth sized to `STEP_MS` the same way."""

    def make() -> Callable[[], int]:
        from functools import partial

        import jax
        import jax.numpy as jnp

        import tabloader
        from tabloader.jax import JaxLoader

        on_gpu = ctx.gpu == "real"
        width = WIDTH if on_gpu else 32  # JAX on the CPU: the emulated device, in CI
        features = len(ctx.cats) + len(ctx.conts)
        keys = jax.random.split(jax.random.PRNGKey(0), 3)
        params = [
            jax.random.normal(keys[0], (features, width)) / features**0.5,
            jax.random.normal(keys[1], (width, width)) / width**0.5,
            jax.random.normal(keys[2], (width, 1)) / width**0.5,
        ]

        def loss(params: list[Any], x: Any, y: Any, depth: int) -> Any:
            w_in, w, w_out = params
            h = x @ w_in
            for _ in range(depth):
                h = jax.nn.relu(h @ w)
            return jnp.mean(((h @ w_out).reshape(-1) - y.reshape(-1)) ** 2)

        @partial(jax.jit, static_argnums=3)
        def step(params: list[Any], columns: dict[str, Any], y: Any, depth: int) -> list[Any]:
            x = jnp.stack(
                [columns[c].astype(jnp.float32) * 1e-6 for c in ctx.cats]
                + [columns[c] for c in ctx.conts],
                axis=1,
            )
            grads = jax.grad(loss)(params, x, y, depth)
            return [p - 1e-3 * g for p, g in zip(params, grads, strict=True)]

        rows = ctx.batch_size
        resident = (
            {c: jnp.zeros(rows, jnp.int32) for c in ctx.cats}
            | {c: jnp.ones(rows, jnp.float32) for c in ctx.conts},
            jnp.zeros(rows, jnp.float32),
        )

        def time_steps(depth: int, steps: int) -> float:
            state = params
            state = jax.block_until_ready(step(state, *resident, depth))  # compiled
            started = time.perf_counter()
            for _ in range(steps):
                state = step(state, *resident, depth)
            jax.block_until_ready(state)
            return (time.perf_counter() - started) / steps

        per_step = time_steps(4, 10)
        depth = max(1, min(64, round(4 * STEP_MS / 1e3 / per_step)))
        steps = -(-ctx.rows // ctx.batch_size)
        fact("width", width)
        fact("depth", depth)
        fact("step_ms_alone", 1e3 * time_steps(depth, steps))
        loader = JaxLoader(
            tabloader.Dataset(ctx.files), **ctx.loader_options, seed=0, shuffle=True,
            device="cuda",
        )  # fmt: skip
        state = {"params": params}

        def run() -> int:
            delivered = steps = 0
            current = state["params"]
            for columns, y in loader:
                current = step(current, columns, y, depth)
                delivered += int(y.shape[0])
                steps += 1
            state["params"] = jax.block_until_ready(current)
            fact("steps_per_epoch", steps)
            loader_facts(loader.loader)
            return delivered

        return run

    return make
