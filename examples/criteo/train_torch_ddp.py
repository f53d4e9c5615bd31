"""Data-parallel training on Criteo-like data: one process per rank, each reading its shard.

Runs on CPUs (gloo) or GPUs (nccl, one per process)::

    torchrun --standalone --nproc_per_node=2 examples/criteo/train_torch_ddp.py --synthetic
    torchrun --standalone --nproc_per_node=2 examples/criteo/train_torch_ddp.py --data ~/criteo

With ``--checkpoint PATH`` rank 0 saves the model, the optimizer and the loader's state
(one for the whole job, agreed by every rank) every ``--checkpoint-every`` steps, and a
job that finds the checkpoint continues from it, on any number of ranks: run it under
``torchrun --nnodes=1:4`` and a job pre-empted on 8 GPUs goes on on 4, each remaining row
of the interrupted epoch trained on once. ``--stop-after STEPS`` leaves after that many
steps, checkpoint written, as a pre-empted job would.

Every rank builds the same ``TorchAsyncItr`` with the same seed; ``global_rank`` and
``global_size`` come from the initialised process group. Each epoch every rank reads a
disjoint shard of ``len(dataset) // world_size`` rows and gets the same number of
batches, so the gradient all-reduces of ``DistributedDataParallel`` stay in step. The
seed is drawn on rank 0 and broadcast, and ``seed_fn`` hands it to the loader.
The model, the flags and the data (``--data`` with ``train/``, or ``--synthetic``) are
those of ``train_torch.py``; ``--batch-size`` is per rank. Rank 0 writes the generated
data while the other ranks wait.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import tabloader
import tabloader.torch
from tabloader.synthetic import CATS, CONTS, LABELS
from tabloader.torch import DLDataLoader, TorchAsyncItr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_torch import ClickModel, build_parser, table_sizes

import example_flags as common


def broadcast_seed(device: torch.device) -> int:
    """A fresh seed drawn on rank 0, the same on every rank."""
    seed = torch.randint(0, 2**31 - 1, (1,), dtype=torch.int64, device=device)
    dist.broadcast(seed, src=0)
    return int(seed.item())


def build_ddp_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    parser.description = __doc__.split("\n")[0]
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="save the model, optimizer and loader here (rank 0), and resume from it when "
        "it exists, on any number of ranks",
    )
    parser.add_argument(
        "--checkpoint-every", type=common.at_least(1), default=100, help="steps between checkpoints"
    )
    parser.add_argument(
        "--stop-after",
        type=common.at_least(1),
        default=None,
        help="leave after this many steps of this run, checkpoint written, as if pre-empted",
    )
    return parser


def save_checkpoint(path: Path, rank: int, **state: Any) -> None:
    """Rank 0 writes ``state`` to ``path``, whole or not at all (a job pre-empted while
    writing keeps the checkpoint before)."""
    if rank == 0:
        partial = path.with_name(path.name + ".partial")
        torch.save(state, partial)
        os.replace(partial, path)
    dist.barrier()


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Train; return the mean train loss of every epoch, averaged over the ranks (a
    resumed epoch's over the steps after the resume)."""
    parser = build_ddp_parser()
    args = parser.parse_args(argv)
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    threads = common.torch_threads(args.threads, ranks_per_machine=local_ranks)
    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP broadcasts them)

    def train_directory(announce: bool) -> list[str]:
        data = common.data_directory(
            args,
            parser,
            needs=["train/"],
            generate=lambda directory: common.write_synthetic_criteo(directory, args.rows),
            how_to_get="examples/criteo/convert.py writes it",
            announce=announce,
        )
        return common.parquet_files(data / "train")

    if rank == 0:
        train_files = train_directory(announce=True)  # writes --synthetic data first
    dist.barrier()
    if rank != 0:
        train_files = train_directory(announce=False)  # what rank 0 found or wrote

    # global_rank/global_size default to the process group's rank and world size.
    train = TorchAsyncItr(
        tabloader.Dataset(train_files),
        cats=CATS,
        conts=CONTS,
        labels=LABELS,
        batch_size=args.batch_size,
        shuffle=True,
        seed_fn=lambda: broadcast_seed(device),
        # worker processes read on the host (CUDA does not work in them)
        **({"device": "cpu"} if args.workers else common.loader_placement(device)),
    )
    loader = DLDataLoader(train, batch_size=None, collate_fn=lambda x: x, num_workers=args.workers)
    if rank == 0:
        print(
            f"{world} ranks, {len(loader)} batches of {args.batch_size} rows per rank per "
            f"epoch, PyTorch threads per rank: {threads}"
        )

    # Every rank sizes the tables from the same footers, so the models match.
    sizes = table_sizes(train_files, args.buckets, args.embedding_dim)
    model = DistributedDataParallel(ClickModel(sizes, len(CONTS)).to(device))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()

    history: list[float] = []
    if args.checkpoint is not None and args.checkpoint.exists():
        # saved by rank 0 of a job on any number of ranks: every rank loads the same
        checkpoint = torch.load(args.checkpoint, weights_only=True)
        model.module.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        train.load_state_dict(checkpoint["loader"])
        history = list(checkpoint["history"])
        if rank == 0:
            saved = checkpoint["loader"]
            print(
                f"resumed from {args.checkpoint}: epoch {saved['epoch']}, saved by "
                f"{saved['global_size']} ranks after {saved['batches']} batches each, "
                f"now on {world}"
            )
    steps = 0
    for epoch in range(train.epoch, args.epochs):
        started = time.perf_counter()
        total = torch.zeros(2, dtype=torch.float64, device=device)
        rows = len(train.loader.dataset) // world
        progress = common.epoch_progress(rows, epoch) if rank == 0 else None
        for x_cat, x_cont, y in loader:
            x_cat, x_cont, y = (t.to(device, non_blocking=True) for t in (x_cat, x_cont, y))
            loss = loss_fn(model(x_cat, x_cont), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach().double(), torch.ones((), device=device)])
            if progress is not None:
                progress.update(len(y))
            steps += 1
            stopping = steps == args.stop_after
            if args.checkpoint is not None and (stopping or steps % args.checkpoint_every == 0):
                # every rank takes part: the ranks' loader states are checked to be one
                loader_state = tabloader.torch.agreed_state(loader)
                save_checkpoint(
                    args.checkpoint, rank, model=model.module.state_dict(),
                    optimizer=optimizer.state_dict(), loader=loader_state, history=history,
                )  # fmt: skip
            if stopping:
                break
        if progress is not None:
            progress.close()
        if steps == args.stop_after:
            if rank == 0:
                print(f"left after {steps} steps, as if pre-empted")
            break
        dist.all_reduce(total)
        if total[1] == 0:  # resumed from a checkpoint taken at this epoch's last step
            if rank == 0:
                print(f"epoch {epoch}: every batch was trained on before the restart")
            continue
        mean = float(total[0] / total[1])
        history.append(mean)
        if rank == 0:
            print(f"epoch {epoch}: train loss {mean:.4f} ({time.perf_counter() - started:.1f} s)")
    # The model (its DDP reducer) holds the process group: let go of it and destroy the
    # group while Python is running, so its worker threads are joined now. A group
    # left to the interpreter's exit can abort the process there (a worker finishing a
    # collective on a tensor Python no longer looks after).
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()
    return history


if __name__ == "__main__":
    main()
