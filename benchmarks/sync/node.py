"""One benchmark process (run inside its namespace by measure.py): times sync steps.

    python -m benchmarks.sync.node '<json plan>'

For every trial of the plan, all ranks meet at a gloo barrier, rank 0 broadcasts a
wall-clock start (one machine, one clock), and each rank then times, from that instant:
  noloco-<codec>: optional compute sleep, then the runtime's outer round
      (workers.outer.exchanger.OuterExchanger): compress once, push to the rank's matched
      partner (the seeded partition of all ranks, as workers compute it) while receiving
      its push, both directions at once;
  allreduce: optional compute sleep, flatten into one buffer (a DDP bucket),
      dist.all_reduce over gloo, divide, unflatten.
Each rank appends one JSON line per trial to <results_dir>/rank<r>.jsonl.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import zmq

from noloco_rt.config import Config, load_config
from noloco_rt.model.llama import build_model
from noloco_rt.net.transport import ExchangeServer
from noloco_rt.outer.formula import OuterCoefficients, PeerOuterState
from noloco_rt.outer.matching import matched_partners
from noloco_rt.routing.peers import Blacklist
from workers.outer.device_boundary import HostContribution
from workers.outer.exchanger import OuterExchanger, OuterRound
from workers.outer.partners import Partner
from workers.outer.service import SnapshotService

EXCHANGE_PORT = 6100  # + rank, so the loopback fallback needs no namespaces
SYNTHETIC_TENSOR_NUMEL = 1 << 22  # 16 MiB float32 pieces, about the size of a large layer


class _Null:
    """Absorbs metrics and log calls; remembers the last log event's fields."""

    def __init__(self) -> None:
        self.last: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> _Null:
        if args and isinstance(args[0], str):
            self.last = {"event": args[0], **kwargs}
        return self


class StaticPeers:
    """What the exchanger asks of noloco_rt.routing.peers.PeerView: a blacklist."""

    def __init__(self) -> None:
        self.blacklist = Blacklist()


def partners_of(rank: int, world: int, step: int, addrs: list[str]) -> list[Partner]:
    """The rank's group at this outer step in the seeded partition of all ranks."""
    ids = [f"rank{r}" for r in range(world)]
    chosen = matched_partners(ids, f"rank{rank}", seed=0, stage=0, outer_step=step, group_size=2)
    return [Partner(i, addrs[int(i.removeprefix("rank"))], step) for i in chosen]


def parameter_set(size: str, rank: int) -> list[torch.Tensor]:
    """The same parameters on every rank, plus a small per-rank drift as after H inner steps."""
    gen = torch.Generator().manual_seed(1000 + rank)
    if size.startswith("synthetic"):
        mib = int(size.removeprefix("synthetic").removesuffix("mb"))
        total = mib * 1_000_000 // 4
        base = torch.Generator().manual_seed(0)
        sizes = [SYNTHETIC_TENSOR_NUMEL] * (total // SYNTHETIC_TENSOR_NUMEL) + [total % SYNTHETIC_TENSOR_NUMEL]
        tensors = [torch.randn(n, generator=base) * 0.02 for n in sizes if n]
    else:
        model = build_model(size, vocab_size=256, seed=0)  # the config default vocabulary
        tensors = [p.detach().clone() for p in model.parameters()]
    return [t + 1e-4 * torch.randn(t.shape, generator=gen) for t in tensors]


@dataclass
class Holder:
    """The server's handler delegates to the current trial's SnapshotService."""

    service: SnapshotService | None = None
    log: _Null = field(default_factory=_Null)

    def handle(self, frames: list[zmq.Frame]) -> list[Any]:
        assert self.service is not None
        return self.service.handle(frames)


def _config(codec: str, timeout_s: float) -> Config:
    return load_config(environ={}, overrides=[{"run": {"run_id": "syncbench"},
                                              "worker": {"snapshot_codec": codec, "exchange_timeout_s": timeout_s}}])


def _start_together(margin_s: float) -> float:
    dist.barrier()
    start = torch.tensor([time.time() + margin_s], dtype=torch.float64)
    dist.broadcast(start, src=0)
    wait = float(start.item()) - time.time()
    if wait > 0:
        time.sleep(wait)
    return float(start.item())


COEFFS = OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.7)
"""NoLoCo's defaults: the exchanger computes the correction as a worker's does."""


def _on_host(exchanger: OuterExchanger, tensors: list[torch.Tensor]) -> HostContribution:
    """Our contribution as a worker's outer step hands it to the exchanger."""
    return exchanger.service.boundary.contribution_to_host(PeerOuterState(fast=tensors))


def _overlapped_step(exchanger: OuterExchanger, rank: int, world: int, step: int, addrs: list[str],
                     tensors: list[torch.Tensor], compute_s: float) -> dict[str, Any]:
    """The overlapped outer step (docs/architecture.md §4) as a worker takes it: the inner phase up to the
    outer step, the round handed to the exchanger (the provisional local step), then the
    next inner phase at once. Times the span between the two outer steps; the round's
    result is collected afterwards (a correction at the next inner-step boundary)."""
    time.sleep(compute_s)  # the inner phase that ends at this outer step (GPU work: no CPU)
    reached = time.time()
    partners = partners_of(rank, world, step, addrs)
    exchanger.begin(OuterRound(step, _on_host(exchanger, tensors), partners, COEFFS))
    time.sleep(compute_s)  # the next inner phase, on the provisional weights
    done = time.time()
    result = exchanger.result(step, wait_s=3 * exchanger.collect_s)
    return {"done": done, "elapsed_s": done - reached, "round_s": result.seconds if result else None,
            "wire_bytes": result.sent_wire_bytes if result else 0, "raw_bytes": result.sent_raw_bytes if result else 0,
            "peer_ok": bool(result and result.used), "partners": len(partners),
            "peer": ",".join(result.used) if result else ""}


def run(plan: dict[str, Any]) -> None:
    rank, world = plan["rank"], plan["world"]
    torch.set_num_threads(1)  # N processes share 2 cores: threads would only fight
    dist.init_process_group("gloo", init_method=plan["init_method"], rank=rank, world_size=world)
    ctx = zmq.Context()
    holder = Holder()
    server = ExchangeServer(ctx, bind_host=plan["ips"][rank], port=EXCHANGE_PORT + rank, advertise_host="",
                            handler=holder.handle)
    server.start()
    addrs = [f"tcp://{ip}:{EXCHANGE_PORT + r}" for r, ip in enumerate(plan["ips"])]
    out = Path(plan["results_dir"]) / f"rank{rank}.jsonl"
    margin_s = plan["start_margin_s"]
    cache: dict[str, list[torch.Tensor]] = {}
    for trial_index, trial in enumerate(plan["trials"]):
        size, method = trial["size"], trial["method"]
        if size not in cache:
            cache.clear()
            cache[size] = parameter_set(size, rank)
        tensors = cache[size]
        compute_s = trial.get("compute_s", 0.0) * (trial.get("straggler_factor", 1.0)
                                                   if rank == trial.get("straggler_rank", -1) else 1.0)
        steps = trial.get("outer_steps", 1)
        service = exchanger = None
        if method.startswith("noloco-"):
            cfg = _config(method.removeprefix("noloco-").removeprefix("overlap-"), plan["exchange_timeout_s"])
            service = SnapshotService(cfg, 0, f"rank{rank}", metrics=_Null(), log=_Null(),
                                      expected_shapes=[tuple(t.shape) for t in tensors])
            holder.service = service
            exchanger = OuterExchanger(ctx, service, StaticPeers(), collect_s=plan["exchange_timeout_s"], log=_Null())
        for step in range(1, steps + 1):
            start = _start_together(margin_s)
            record: dict[str, Any] = {"rank": rank, "world": world, "trial": trial_index, "step": step, **trial}
            timed_compute_s = compute_s if step == steps else 0.0
            if method.startswith("noloco-overlap-"):
                record.update(_overlapped_step(exchanger, rank, world, step, addrs, tensors, timed_compute_s))
                with out.open("a") as handle:
                    handle.write(json.dumps({**record, "start": start}) + "\n")
                continue
            if timed_compute_s:
                time.sleep(timed_compute_s)
            if exchanger is not None:
                partners = partners_of(rank, world, step, addrs)
                exchanger.begin(OuterRound(step, _on_host(exchanger, tensors), partners, COEFFS))
                result = exchanger.result(step, wait_s=3 * plan["exchange_timeout_s"])
                done = time.time()
                record.update(wire_bytes=result.sent_wire_bytes if result else 0,
                              raw_bytes=result.sent_raw_bytes if result else 0, peer_ok=bool(result and result.used),
                              partners=len(partners), peer=",".join(result.used) if result else "")
            else:
                flat = torch.cat([t.reshape(-1) for t in tensors])  # one bucket, as DDP does
                dist.all_reduce(flat)
                flat /= world
                _ = list(torch.split(flat, [t.numel() for t in tensors]))
                done = time.time()
                record.update(wire_bytes=4 * flat.numel(), raw_bytes=4 * flat.numel())
            record.update(start=start, done=done, elapsed_s=done - start)
            with out.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
        if exchanger is not None:
            exchanger.close()
        if rank == 0:
            print(f"  trial {trial_index + 1}/{len(plan['trials'])} {size} {method} done", flush=True)
    dist.barrier()  # nobody closes its server while a peer may still ask it
    server.stop()
    ctx.destroy(linger=0)
    dist.destroy_process_group()


if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
