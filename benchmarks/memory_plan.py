"""The memory plan (noloco_rt.memory.plan) against the peak of a real stage replica.

For each stage, a StageReplica does what a worker does in one overlapped outer period:
an inner step (max_inflight forwards held, then their backwards as the gradients return,
the optimizer step), the outer step's buffers (our contribution kept for the correction,
its encoding, the partners' decoded contributions, φ and δ published for joiners), one more
inner step while those buffers are held, then the correction. The peak of tensor memory
is measured on the CPU by noloco_rt.memory.tracker, on CUDA by torch.cuda.max_memory_allocated.

    PYTHONPATH=. python benchmarks/memory_plan.py                      # tiny and small, CPU
    PYTHONPATH=. python benchmarks/memory_plan.py --presets 125m 1b    # on a CUDA machine
    PYTHONPATH=. python benchmarks/memory_plan.py --presets --hf-family llama gpt2 qwen2 mistral
        # random transformers folders of each family (hf:PATH: stages measured on fake tensors)
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import Config, load_config
from noloco_rt.memory.fit import plan_settings
from noloco_rt.memory.plan import stage_memory
from noloco_rt.memory.settings import PlanSettings
from noloco_rt.memory.tracker import TensorMemoryTracker
from noloco_rt.model.llama import lm_loss
from noloco_rt.model.staged import staged_model
from noloco_rt.net import wire_dtype
from noloco_rt.outer.codec import decode_tensors
from noloco_rt.outer.correction import correction_term
from noloco_rt.outer.formula import OuterCoefficients
from noloco_rt.outer.snapshot import contribution_parts, contribution_state, encode_snapshot

MIB = 2**20


def config_of(s: PlanSettings) -> Config:
    return load_config(environ={}, overrides=[{
        "model": {"preset": s.preset, "seq_len": s.seq_len, "vocab_size": s.vocab_size, "precision": s.precision,
                  "activation_checkpointing": "on" if s.activation_checkpointing else "off"},
        "data": {"batch_size": s.micro_batch},
        "pipeline": {"stages": s.stages, "max_inflight": s.max_inflight, "wire_dtype": s.wire_dtype},
        "worker": {"snapshot_codec": s.snapshot_codec},
        "outer": {"group_size": s.group_size},
    }])


def _forward(replica: StageReplica, inputs: torch.Tensor, autocast: torch.dtype | None) -> torch.Tensor:
    if autocast is None:
        return replica.module(inputs)
    with torch.autocast(device_type=inputs.device.type, dtype=autocast):
        return replica.module(inputs)


def _inputs(s: PlanSettings, stage: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    if stage == 0:
        return torch.randint(0, s.vocab_size, (s.micro_batch, s.seq_len), generator=generator).to(device)
    width = s.measured[stage - 1].width if s.measured else s.shape.dim
    hidden = torch.randn(s.micro_batch, s.seq_len, width, generator=generator).to(device)
    return hidden.requires_grad_(True)  # as a received activation is


def inner_step(replica: StageReplica, s: PlanSettings, stage: int, device: torch.device,
               generator: torch.Generator) -> None:
    """One inner step as the stage's worker takes it."""
    autocast = torch.bfloat16 if s.precision == "bfloat16" else None
    targets = [torch.randint(0, s.vocab_size, (s.micro_batch, s.seq_len), generator=generator).to(device)
               for _ in range(s.max_inflight)]
    if stage == s.stages - 1:  # the loss and its backward at once, the input's gradient sent back
        for target in targets:
            hidden = _inputs(s, stage, device, generator)
            logits = _forward(replica, hidden, autocast)  # alive during the backward, as in the worker
            loss = lm_loss(logits.float(), target)
            loss.backward()
            del logits
            if hidden.grad is not None:
                wire_dtype.pack(hidden.grad, wire_dtype.gradient_wire_dtype(s.wire_dtype))
            replica.record_microbatch()
    else:  # every forward out first, with its wire copy kept for a re-send; then the gradients
        held = []
        for target in targets:
            inputs = _inputs(s, stage, device, generator)
            output = _forward(replica, inputs, autocast)
            held.append((inputs, output, wire_dtype.pack(output.detach(), s.wire_dtype), target))
        while held:
            inputs, output, _, _ = held.pop(0)
            output.backward(torch.randn(output.shape, generator=generator).to(device, output.dtype))
            if inputs.grad is not None:
                wire_dtype.pack(inputs.grad, wire_dtype.gradient_wire_dtype(s.wire_dtype))
            replica.record_microbatch()
    replica.finish_inner_step()


def run_outer_period(cfg: Config, s: PlanSettings, stage: int, device: torch.device) -> None:
    """Two inner steps around an overlapped outer step, its buffers held over the second."""
    generator = torch.Generator().manual_seed(stage)
    if cfg.model.factory:
        replica = StageReplica.of_module(staged_model(cfg).build_stage(stage).to(device), cfg)
    else:
        replica = StageReplica.create(cfg, stage, device=device)
    coeffs = OuterCoefficients.from_config(cfg.outer.resolved())
    inner_step(replica, s, stage, device, generator)
    before = replica.provisional_outer_step(coeffs)
    parts, kind = contribution_parts(before)
    own = encode_snapshot(parts, s.snapshot_codec, 1, kind)
    published = [t.detach().clone().cpu() for t in (*replica.slow, *replica.momentum)]  # for joiners
    limit = sum(4 * t.numel() for t in parts)
    partners = [contribution_state([t.to(device) for t in decode_tensors(own.encoded, limit)], kind)
                for _ in range(s.group_size - 1)]
    inner_step(replica, s, stage, device, generator)
    replica.correct_outer_step(correction_term(before, partners, coeffs))
    del published


@contextlib.contextmanager
def peak_of(device: torch.device) -> Iterator[dict[str, int]]:
    """{"peak": bytes} once the block is done: tensors created inside it, at their most."""
    result: dict[str, int] = {}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield result
        torch.cuda.synchronize(device)
        result["peak"] = torch.cuda.max_memory_allocated(device) - start
    else:
        with TensorMemoryTracker() as tracker:
            yield result
        result["peak"] = tracker.peak_bytes


def measured_peak(s: PlanSettings, stage: int, device: torch.device | str = "cpu", cfg: Config | None = None) -> int:
    """The peak of a real replica of `stage` over an outer period; `cfg`: the run's (an hf:PATH
    model's) when the settings came from one, else made from the settings (a preset)."""
    device = torch.device(device)
    cfg = cfg or config_of(s)
    with peak_of(device) as result:
        run_outer_period(cfg, s, stage, device)
    return result["peak"]


@dataclass(frozen=True)
class Row:
    label: str
    stage: int
    planned: int
    measured: int

    @property
    def ratio(self) -> float:
        return self.planned / self.measured


def settings_for(preset: str, *, device: torch.device, checkpointing: bool, seq_len: int, micro_batch: int,
                 max_inflight: int) -> PlanSettings:
    return PlanSettings(preset=preset, stages=2, micro_batch=micro_batch, seq_len=seq_len, vocab_size=256,
                        precision="bfloat16" if device.type == "cuda" else "float32",
                        activation_checkpointing=checkpointing, max_inflight=max_inflight,
                        device="cuda" if device.type == "cuda" else "cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="*", default=["tiny", "small"])
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--max-inflight", type=int, default=4)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--hf", nargs="*", default=[], metavar="FOLDER",
                        help="transformers folders (hf:PATH) to plan and measure too (vocabulary >= 256)")
    parser.add_argument("--hf-family", nargs="*", default=[], metavar="MODEL_TYPE",
                        help="random folders of these transformers families, 256 wide and 4 layers deep")
    args = parser.parse_args()
    scratch = tempfile.TemporaryDirectory()
    args.hf += [random_hf_folder(family, Path(scratch.name)) for family in args.hf_family]
    device = torch.device(args.device)
    print(f"device {device}, 2 stages, {args.micro_batch} x {args.seq_len} tokens a microbatch, "
          f"{args.max_inflight} in flight, vocabulary 256\n")
    print("| preset | checkpointing | stage | plan MiB | measured MiB | plan / measured |")
    print("|---|---|---|---|---|---|")
    for preset in args.presets:
        for checkpointing in (False, True):
            s = settings_for(preset, device=device, checkpointing=checkpointing, seq_len=args.seq_len,
                             micro_batch=args.micro_batch, max_inflight=args.max_inflight)
            for stage in range(s.stages):
                row = Row(preset, stage, stage_memory(s, stage).peak, measured_peak(s, stage, device))
                print(f"| {preset} | {'on' if checkpointing else 'off'} | {stage} | {row.planned / MIB:,.1f} | "
                      f"{row.measured / MIB:,.1f} | {row.ratio:.3f} |", flush=True)
    for folder in args.hf:
        cfg = hf_config(folder, device=device, seq_len=args.seq_len, micro_batch=args.micro_batch,
                        max_inflight=args.max_inflight)
        s = plan_settings(cfg, device_type=device.type, max_inflight=args.max_inflight, activation_checkpointing=False)
        for stage in range(s.stages):
            row = Row(folder, stage, stage_memory(s, stage).peak, measured_peak(s, stage, device, cfg))
            print(f"| hf:{Path(folder).name} | off | {stage} | {row.planned / MIB:,.1f} | "
                  f"{row.measured / MIB:,.1f} | {row.ratio:.3f} |", flush=True)


def random_hf_folder(family: str, root: Path) -> str:
    """A transformers folder (config.json, no weights) of `family`, about the small preset's size."""
    from transformers import AutoConfig

    extra = (dict(bos_token_id=0, eos_token_id=0) if family == "gpt2"
             else dict(intermediate_size=688, num_key_value_heads=4))
    AutoConfig.for_model(family, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                         max_position_embeddings=1024, vocab_size=512, tie_word_embeddings=False,
                         **extra).save_pretrained(root / family)
    return str(root / family)


def hf_config(folder: str, *, device: torch.device, seq_len: int, micro_batch: int, max_inflight: int,
              stages: int = 2, precision: str | None = None) -> Config:
    """A run of a transformers folder's model as the benchmark plans it."""
    return load_config(environ={}, overrides=[{
        "model": {"factory": f"hf:{Path(folder).resolve()}", "seq_len": seq_len, "vocab_size": 256,
                  "precision": precision or ("bfloat16" if device.type == "cuda" else "float32")},
        "data": {"batch_size": micro_batch},
        "pipeline": {"stages": stages, "max_inflight": max_inflight},
    }])


if __name__ == "__main__":
    main()
