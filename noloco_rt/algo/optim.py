"""The inner optimizer and its learning-rate schedule (docs/architecture.md §1). Pure tensor code, no I/O.

The outer step lives in noloco_rt.outer.formula."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from noloco_rt.algo.fused_adamw import FusedAdamW, fused_kernel_available
from noloco_rt.config import OptimConfig


def lr_at(step: int, *, lr: float, lr_min: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup from lr/warmup to lr, then cosine decay to lr_min at total_steps."""
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return lr_min + 0.5 * (lr - lr_min) * (1 + math.cos(math.pi * progress))


def adamw_kernel(device: torch.device) -> dict[str, bool]:
    """AdamW's implementation for parameters on `device`: fused (one kernel for all the
    parameters, no per-tensor launches) on CUDA and the CPU, the only kernel that skips a step
    on the device's own word (`found_inf`); elsewhere foreach."""
    return {"fused": True} if fused_kernel_available(device) else {"foreach": True}


class InnerOptimizer:
    """AdamW on one stage's parameters with the run's schedule and per-stage grad clipping.

    Its state is local to the worker: never averaged, never reset by an outer step.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], cfg: OptimConfig, total_steps: int) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.cfg = cfg
        self.total_steps = total_steps
        self.warmup_steps = cfg.warmup_steps_for(total_steps)
        self.steps_taken = 0
        """Inner steps taken or skipped: the schedule's position."""
        device = self.params[0].device if self.params else torch.device("cpu")
        self._skips_on_device = fused_kernel_available(device)
        self._skipped = torch.zeros((), dtype=torch.float32, device=device)
        betas = (cfg.adam_beta1, cfg.adam_beta2)
        # The fused kernel without torch.optim, which would import torch._dynamo into every
        # worker (noloco_rt/algo/fused_adamw.py); torch.optim's foreach AdamW elsewhere.
        self.optimizer: FusedAdamW | torch.optim.AdamW = (
            FusedAdamW(self.params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay)
            if self._skips_on_device else
            torch.optim.AdamW(self.params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay, foreach=True))
        self._keeps_gradient_buffers = False

    def keep_gradient_buffers(self) -> None:
        """From now on each parameter's gradient lives in a buffer of its own, made here and
        zeroed after each step, into which backward adds in place. Without one, the first
        microbatch's backward installs its own output as the gradient; under CUDA graphs that
        output is memory the next replay overwrites, and the microbatches after it would be
        added to garbage (model.cuda_graphs)."""
        with torch.no_grad():
            for param in self.params:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
        self._keeps_gradient_buffers = True

    def clear_gradients(self) -> None:
        """Gradients gone (None) after a step, or zeroed in their buffers if they are kept."""
        self.optimizer.zero_grad(set_to_none=not self._keeps_gradient_buffers)

    def current_lr(self) -> float:
        return lr_at(self.steps_taken, lr=self.cfg.lr, lr_min=self.cfg.lr_min,
                     warmup_steps=self.warmup_steps, total_steps=self.total_steps)

    def step(self, *, grad_divisor: float = 1.0) -> torch.Tensor:
        """Clip, step and clear gradients, stepping with the gradients divided by `grad_divisor`
        (summed over that many microbatches: their mean); returns the divided gradient's norm
        before clipping, still on the device: nothing here waits for the device (reading the
        norm would). With the fused kernel the division and the clipping are one scale it
        applies as it reads each gradient (`grad_scale`), not two passes over the gradients
        before it (benchmarks/inner_step.py).

        A non-finite gradient (a poisoned or broken microbatch) changes neither weights nor
        optimizer state: the fused kernel skips the step itself when told by `found_inf`, a
        flag computed on the device, and the skip is counted there too (skipped_nonfinite
        reads it). The schedule moves on regardless, as it would with a gradient scaler."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if self._skips_on_device:
            norm = torch.nn.utils.get_total_norm(grads, foreach=True) / grad_divisor
            nonfinite = torch.logical_not(torch.isfinite(norm)).to(torch.float32)
            scale = torch.full_like(norm, grad_divisor)
            if self.cfg.grad_clip > 0:  # clip_grad_norm_'s factor: max_norm / (norm + 1e-6), at most 1
                scale = scale / torch.clamp(self.cfg.grad_clip / (norm + 1e-6), max=1.0)
            self.optimizer.grad_scale = scale  # the fused kernel divides each gradient by it
            self.optimizer.found_inf = nonfinite  # and skips the step on it
        else:  # foreach (an accelerator without a fused AdamW): divide and clip first, read the flag here
            if grad_divisor != 1.0:
                torch._foreach_div_(grads, grad_divisor)
            if self.cfg.grad_clip > 0:
                norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip, foreach=True)
            else:
                norm = torch.nn.utils.get_total_norm(grads, foreach=True)
            if not math.isfinite(float(norm)):
                self._skipped.add_(1.0)
                self.clear_gradients()
                self.steps_taken += 1
                return norm
        if isinstance(self.optimizer, FusedAdamW):
            self.optimizer.lr = self.current_lr()
        else:
            for group in self.optimizer.param_groups:
                group["lr"] = self.current_lr()
        self.optimizer.step()
        if self._skips_on_device:
            self._skipped.add_(nonfinite.to(self._skipped.device))
        self.clear_gradients()
        self.steps_taken += 1
        return norm

    @property
    def skipped_nonfinite(self) -> int:
        """Inner steps skipped for a non-finite gradient (reading it waits for the device)."""
        return int(self._skipped.item())

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "steps_taken": self.steps_taken}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps_taken = int(state["steps_taken"])


@torch.no_grad()
def average_gradients(replica_params: Sequence[Sequence[torch.nn.Parameter]], weights: Sequence[float]) -> None:
    """The ddp baseline: every replica's .grad becomes Σ_r w_r·grad_r (replicas without a
    gradient count as zero). Gradients summed over microbatches with w_r = 1/total
    microbatches give the all-reduced mean."""
    count = len(replica_params[0])
    for index in range(count):
        grads = [params[index].grad for params in replica_params]
        reference = next((g for g in grads if g is not None), None)
        if reference is None:
            continue
        total = torch.zeros_like(reference)
        for grad, weight in zip(grads, weights, strict=True):
            if grad is not None and weight != 0:
                total.add_(grad, alpha=weight)
        for params in replica_params:
            params[index].grad = total.clone()
