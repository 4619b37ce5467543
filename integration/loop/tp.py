"""Tensor parallelism over torch.distributed (nano-vllm style).

Heads, MLP width and vocab are split across ranks with `narrow`; the latent KV
is replicated. A row-parallel output does exactly one all-reduce. The vocab-
parallel LM head all-gathers its logit shards. `simulate` runs rank 0's shard of
a `tp`-way split in a single process: shapes are per-rank, collectives are
skipped (the numbers are then rank 0's partial sums, fine for timing only).
"""
from __future__ import annotations

import os
import queue
import socket
from dataclasses import dataclass
import contextlib
from typing import Callable, Optional

import torch
import torch.distributed as dist


@dataclass
class TPGroup:
    rank: int = 0
    size: int = 1              # shard count (per-rank shapes use this)
    simulate: bool = False     # True: single process holding rank 0's shard, collectives skipped
    timer: Optional[object] = None   # a timing.StepTimer: collectives are timed as the part "allreduce"
    traffic: Optional[Callable[[str, int], None]] = None   # traffic.py: told the bytes a collective moves per rank

    @property
    def real(self) -> bool:
        return self.size > 1 and not self.simulate

    def shard(self, n: int, what: str) -> tuple[int, int]:
        """(start, length) of this rank's slice of a dim of size n."""
        if n % self.size:
            raise ValueError(f"{what} = {n} does not split evenly over tp={self.size}")
        per = n // self.size
        return self.rank * per, per

    def _count(self, x: torch.Tensor, factor: float) -> None:
        """Tell traffic.py the bytes a rank sends plus receives (factor x payload), also when simulated."""
        if self.traffic is not None and self.size > 1:
            self.traffic("allreduce", int(factor * x.numel() * x.element_size()))

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        self._count(x, 4 * (self.size - 1) / self.size)     # ring: reduce-scatter + all-gather, each way
        if not self.real:
            return x
        with self._timed():
            dist.all_reduce(x)
        return x

    def _timed(self):
        return self.timer.part("allreduce") if self.timer is not None else contextlib.nullcontext()

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's x along the last dim (vocab-parallel logits)."""
        self._count(x, 2 * (self.size - 1))                  # ring: the shard goes out and n-1 come in
        if not self.real:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        with self._timed():
            dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)


def column_shard(w: torch.Tensor, tp: TPGroup, what: str) -> torch.Tensor:
    """w [out, in] -> this rank's rows [out/tp, in]."""
    s, n = tp.shard(w.shape[0], what)
    return w.narrow(0, s, n).contiguous()


def row_shard(w: torch.Tensor, tp: TPGroup, what: str) -> torch.Tensor:
    """w [out, in] -> this rank's columns [out, in/tp]."""
    s, n = tp.shard(w.shape[1], what)
    return w.narrow(1, s, n).contiguous()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, backend: str, fn, args, result_q) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)  # 8 ranks on a few cores: oversubscription would dominate
    dev = None
    if backend == "nccl":
        dev = torch.device("cuda", rank)
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, rank=rank, world_size=world, device_id=dev)
    try:
        res = fn(TPGroup(rank, world), *args)
        result_q.put((rank, "ok", res if rank == 0 else None))
        # every rank done with its collectives before any tears its process group down: a gloo rank whose peer had
        # already gone aborted in its own teardown once (exit -6, "terminate called without an active exception",
        # after it had reported its result; CI, 2026-12-07). A rank that failed instead is terminated by launch().
        dist.barrier()
    except BaseException as e:  # report, then re-raise so the process exits non-zero
        import traceback
        result_q.put((rank, "error", traceback.format_exc()))
        raise e
    finally:
        dist.destroy_process_group()


def launch(world: int, fn, *args, backend: str | None = None):
    """Run fn(tp_group, *args) on `world` ranks (spawned processes; world 1 runs inline).

    Returns rank 0's return value; raises RuntimeError with a rank's traceback if one fails.
    """
    if world == 1:
        return fn(TPGroup(0, 1), *args)
    import torch.multiprocessing as mp
    backend = backend or ("nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, backend, fn, args, q)) for r in range(world)]
    for p in procs:
        p.start()
    results, errors = {}, []
    while len(results) < world and not errors:
        try:
            rank, status, payload = q.get(timeout=1.0)
        except queue.Empty:   # a rank that died without reporting (killed, segfault) must not hang us
            dead = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in results]
            if dead:
                errors.append((dead[0][0], f"exited with code {dead[0][1]} without reporting"))
            continue
        if status == "ok":
            results[rank] = payload
        else:
            errors.append((rank, payload))
    if errors:
        for p in procs:
            p.terminate()
    for p in procs:
        p.join()
    if errors:
        rank, tb = errors[0]
        raise RuntimeError(f"rank {rank} failed:\n{tb}")
    bad = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        raise RuntimeError(f"ranks exited non-zero: {bad}")
    return results[0]
