"""How many bits a partner's θ is worth to a receiver that holds its own θ, and what the
modulo code (noloco_rt.outer.side_info) sends (the simulator).

    .venv/bin/python -m benchmarks.side_information --replicas 4,8 --seeds 0,1,2 --steps 2000 \
        --out benchmarks/results/side_information.md

At each outer step of the last --last inner steps (default: the whole run), for every pair
the outer step draws (receiver r, sender s, same stage), on the int8 codec's grid (the
sender's block scale absmax / 127 over blocks of 64: what int8-zstd sends, the precision
whose convergence cost was measured), with k = round(θ / step):

- H(k_s): bits per value of the sender's codes with an ideal entropy coder and no side
  information (int8-zstd sends 8);
- H(k_s − k_r): bits per value when the receiver's own θ is known to the coder, the
  Slepian-Wolf bound of any scheme that codes θ against the receiver's θ at that precision
  (coset or modulo codes, "side information") without knowing it at the sender;
- the bits a modulo code needs to resolve 99.9 % of values (2·|k_s − k_r| + 1 residues);
- the ratio to float32 each would reach, with the block scales (0.5 bit per value) added;
- the modulo code itself, for each of --bits: the sender's int8 codes exactly as the
  simulator's int8-zstd exchange draws them (per tensor, its generator for that replica and
  step), coded against the receiver's own θ, resolved, the failed blocks repaired; bytes
  both ways (code, request, repair) ÷ float32, and the share of blocks repaired. Every
  pair's result is checked to be int8-zstd's values bit for bit, so the code's
  convergence is int8-zstd's (benchmarks/README.md "Snapshot codecs at 2,000 steps");
- the adaptive code: each tensor sent with the bits (2..7, or int8 whole) that the
  receiver of the sender's previous push found cheapest for it (the receiver knows every
  choice's cost once it holds the codes: side_info.bytes_by_bits), int8 at first; and
  each tensor's cheapest choice in hindsight, which no sender can know in advance.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.seeded_bench import parse_seeds
from benchmarks.table import emit, markdown_table
from noloco_rt.config import load_config, parse_assignment
from noloco_rt.outer import side_info
from noloco_rt.outer.codecs.quantized import dequantize, quantize
from noloco_rt.outer.side_info import MAX_CODE
from noloco_rt.simulation.lossy_exchange import exchange_generator
from noloco_rt.simulation.simulator import Simulation

BLOCK = 64
SCALE_BITS = 32 / BLOCK
"""One float32 scale per block, spread over its values."""


def entropy_bits(codes: torch.Tensor) -> float:
    """Empirical entropy (bits per value) of an integer tensor."""
    _, counts = torch.unique(codes, return_counts=True)
    p = counts.double() / counts.sum()
    return float(-(p * p.log2()).sum())


@dataclass(frozen=True)
class PairBits:
    plain: float
    """H(k_s)."""
    side: float
    """H(k_s − k_r)."""
    modulo: float
    """log2 of the residues a modulo code needs for 99.9 % of values."""
    diff_steps_rms: float
    """rms of θ_s − θ_r in int8 steps."""


def pair_bits(sender: torch.Tensor, receiver: torch.Tensor) -> PairBits:
    """Both flat float tensors of one stage; the int8 grid is the sender's."""
    blocks = sender.numel() // BLOCK
    s = sender[: blocks * BLOCK].double().view(blocks, BLOCK)
    r = receiver[: blocks * BLOCK].double().view(blocks, BLOCK)
    step = (s.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-30)  # (blocks, 1)
    k_s, k_r = torch.round(s / step), torch.round(r / step)
    diff = (k_s - k_r).reshape(-1)
    reach = float(torch.quantile(diff.abs()[torch.randperm(diff.numel())[:1_000_000]].float(), 0.999))
    return PairBits(plain=entropy_bits(k_s.reshape(-1)), side=entropy_bits(diff),
                    modulo=math.log2(2 * reach + 1), diff_steps_rms=float(((s - r) / step).pow(2).mean().sqrt()))


@dataclass
class CodeBytes:
    """The modulo code's traffic at one number of bits, summed over pairs."""

    wire: int = 0
    float32: int = 0
    blocks: int = 0
    repaired: int = 0


def int8_codes(parts: Sequence[torch.Tensor], generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(scales, codes) of each tensor as int8-zstd quantises it with `generator` (its draws in
    the same order as noloco_rt.outer.codec.encode_tensors makes them)."""
    return [quantize(t.detach().cpu().contiguous().reshape(-1).float(), MAX_CODE, generator) for t in parts]


def code_pair(sender: list[tuple[torch.Tensor, torch.Tensor]], receiver: Sequence[torch.Tensor],
              fixed: dict[int, CodeBytes]) -> list[dict[int, int]]:
    """Send the sender's int8 codes against the receiver's θ (one tensor per part) with each
    fixed number of bits, repair, and add the traffic to `fixed`; AssertionError unless the
    receiver ends with int8's values. Returns, per tensor, what every choice
    (side_info.bytes_by_bits, which the receiver can tell the sender) would have cost."""
    costs: list[dict[int, int]] = []
    for (scales, codes), own in zip(sender, receiver, strict=True):
        reference = own.detach().reshape(-1).float()
        costs.append(side_info.bytes_by_bits(scales, codes, reference))
        for bits, into in fixed.items():
            code = side_info.encode(scales, codes, bits)
            resolved = side_info.resolve(code, reference)
            values = side_info.repaired(code, resolved, side_info.repair_codes(codes, resolved.failed))
            assert torch.equal(values, dequantize(scales, codes)), "the modulo code lost a value"
            into.wire += side_info.wire_bytes(code, resolved.failed.numel())
            into.float32 += 4 * codes.numel()
            into.blocks += scales.numel()
            into.repaired += resolved.failed.numel()
    return costs


class MeasuredSimulation(Simulation):
    """The simulator, measuring every pair of every outer step from inner step `since`."""

    def __init__(self, cfg, since: int, bits: Sequence[int] = ()) -> None:
        super().__init__(cfg)
        self.since = since
        self.pairs: list[PairBits] = []
        self.codes = {b: CodeBytes() for b in bits}
        self.adaptive = CodeBytes()
        """Each tensor of each sender with the bits its previous push's receiver found
        cheapest for it (int8 at first)."""
        self.hindsight = CodeBytes()
        """Each tensor of each pair with its own cheapest choice: what no sender can know in advance."""
        self.hints: dict[tuple[int, int, int], int] = {}
        self._stage_calls = 0

    def _groups(self, count: int) -> list[list[int]]:
        groups = super()._groups(count)  # called once per stage, in order, before that stage's update
        stage = self._stage_calls % len(self.replicas)
        self._stage_calls += 1
        if self.step >= self.since:
            flat = [torch.cat([t.detach().reshape(-1).float() for t in r.fast]) for r in self.replicas[stage]]
            self.pairs += [pair_bits(flat[j], flat[members[0]]) for members in groups for j in members[1:]]
            if self.codes:
                self._code_pairs(stage, groups)
        return groups

    def _code_pairs(self, stage: int, groups: list[list[int]]) -> None:
        """Every member's θ coded against every other member's, as int8-zstd draws it."""
        replicas = self.replicas[stage]
        senders = {j for members in groups if len(members) > 1 for j in members}
        drawn = {j: int8_codes(replicas[j].fast, exchange_generator(self.cfg.run.seed, stage, j, self.outer_steps))
                 for j in senders}
        float32 = sum(4 * t.numel() for t in replicas[0].fast)
        for members in groups:
            receiver = replicas[members[0]].fast
            for j in members[1:]:
                for index, costs in enumerate(code_pair(drawn[j], receiver, self.codes)):
                    used = self.hints.get((stage, j, index), side_info.INT8)
                    self.hints[(stage, j, index)] = side_info.cheapest(costs)
                    self.adaptive.wire += costs[used]
                    self.hindsight.wire += min(costs.values())
                self.adaptive.float32 += float32
                self.hindsight.float32 += float32


def measure(replicas: int, seed: int, steps: int, last: int, assignments: Sequence[str],
            bits: Sequence[int] = ()) -> dict[str, float]:
    torch.set_num_threads(1)
    shape = [f"pipeline.replicas={replicas}", "pipeline.stages=2", f"run.steps={steps}", "outer.method=noloco",
             "pipeline.max_inflight=1", f"run.seed={seed}", *assignments]
    cfg = load_config(None, environ={}, overrides=[parse_assignment(a) for a in shape])
    sim = MeasuredSimulation(cfg, since=steps - last, bits=bits)
    while sim.step < steps:
        sim.train_step()
    coded = {f"code{b}": c.float32 / c.wire for b, c in sim.codes.items()}
    coded |= {"adaptive": sim.adaptive.float32 / sim.adaptive.wire, "hindsight": sim.hindsight.float32 / sim.hindsight.wire}
    repaired = {f"repaired{b}": c.repaired / c.blocks for b, c in sim.codes.items()}
    return ({field: statistics.fmean(getattr(p, field) for p in sim.pairs)
             for field in ("plain", "side", "modulo", "diff_steps_rms")}
            | {"pairs": len(sim.pairs)} | coded | repaired)


def _range(values: Sequence[float], fmt: str) -> str:
    return f"{statistics.fmean(values):{fmt}} [{min(values):{fmt}}–{max(values):{fmt}}]"


def report(results: dict[tuple[int, int], dict[str, float]], args: argparse.Namespace) -> str:
    rows = []
    for replicas in args.replicas:
        runs = [r for (n, _), r in results.items() if n == replicas]

        def column(field: str, fmt: str = ".2f", runs: list[dict[str, float]] = runs) -> str:
            return _range([r[field] for r in runs], fmt)

        def ratio(field: str, runs: list[dict[str, float]] = runs) -> str:
            return _range([32 / (r[field] + SCALE_BITS) for r in runs], ".1f") + "x"

        built = [_range([r[f"code{b}"] for r in runs], ".1f") + "x, "
                 + _range([100 * r[f"repaired{b}"] for r in runs], ".1f") + " %" for b in args.bits]
        rows.append([str(replicas), str(len(runs)), column("diff_steps_rms"), column("plain"), column("side"),
                     column("modulo"), f"{32 / (8 + SCALE_BITS):.1f}x", ratio("plain"), ratio("side"), ratio("modulo"),
                     *built, column("adaptive", ".1f") + "x", column("hindsight", ".1f") + "x"])
    window = f"last {args.last} of {args.steps}" if args.last < args.steps else f"all {args.steps}"
    title = (f"Bits per value of a partner's θ on int8's grid, outer steps of {window} inner steps, "
             "tiny preset, 2 stages (`python -m benchmarks.side_information`): mean [range] over seeds; "
             "the code's columns: ÷ float32 both ways (code, request, repair), blocks repaired")
    return markdown_table(title, ["replicas", "seeds", "rms θ_s − θ_r (int8 steps)", "H(k_s)", "H(k_s − k_r)",
                                  "modulo bits (99.9 %)", "int8 ÷ float32", "ideal coder", "with side info (bound)",
                                  "modulo estimate", *[f"{b}-bit code (built)" for b in args.bits],
                                  "adaptive code", "each tensor's cheapest"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=lambda text: [int(x) for x in text.split(",")], default=[4, 8])
    parser.add_argument("--seeds", type=parse_seeds, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--last", type=int, default=None,
                        help="measure the outer steps of the last LAST inner steps (default: all of them)")
    parser.add_argument("--bits", type=lambda text: [int(x) for x in text.split(",")], default=[3, 4, 5],
                        help="low bits per value of the modulo codes to run (2..7)")
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.last = args.steps if args.last is None else min(args.last, args.steps)
    keys = [(replicas, seed) for replicas in args.replicas for seed in args.seeds]
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {key: pool.submit(measure, *key, args.steps, args.last, args.assignments, args.bits) for key in keys}
        results = {}
        for key, future in futures.items():
            results[key] = future.result()
            print(f"{key[0]} replicas, seed {key[1]}: {results[key]}", flush=True)
    emit(report(results, args), args.out)


if __name__ == "__main__":
    main()
