"""AdamW on the device's fused kernel, driven without torch.optim (pure tensor code).

torch.optim's Optimizer imports torch._dynamo the first time it adds a parameter group and
on every step (to keep itself out of compiled graphs). A worker that compiles nothing paid
for it anyway: on the test machine 2.3 s of a core at start-up, 77 MB of memory and
~120,000 more objects (benchmarks/process_heap.py). This calls the same kernel that
`torch.optim.AdamW(fused=True)` calls, in the same order, so the steps are bit for bit the
same (tests/algo/test_fused_adamw.py), and keeps its state in torch.optim's state_dict
layout, so a checkpoint written by either loads into the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def fused_kernel_available(device: torch.device) -> bool:
    """Whether AdamW's fused kernel runs on `device` in this torch."""
    return device.type in ("cuda", "cpu") and hasattr(torch, "_fused_adamw_")


class FusedAdamW:
    """AdamW (decoupled weight decay, no amsgrad) on one list of parameters.

    `grad_scale` and `found_inf` (0-dim float32 tensors, or None) are read at each step:
    the kernel divides every gradient by `grad_scale` as it reads it and skips the whole
    step, step counts included, where `found_inf` is non-zero, without the host reading it.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], *, lr: float, betas: tuple[float, float],
                 weight_decay: float, eps: float = 1e-8) -> None:
        self.params = list(params)
        self.lr = lr
        self.betas = betas
        self.weight_decay = weight_decay
        self.eps = eps
        self.state: dict[torch.nn.Parameter, dict[str, torch.Tensor]] = {}
        self.grad_scale: torch.Tensor | None = None
        self.found_inf: torch.Tensor | None = None

    def _state_of(self, param: torch.nn.Parameter) -> dict[str, torch.Tensor]:
        state = self.state.get(param)
        if not state:  # as torch.optim's first step: a float32 step count on the parameter's device
            state = self.state[param] = {
                "step": torch.zeros((), dtype=torch.float32, device=param.device),
                "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format)}
        return state

    @torch.no_grad()
    def step(self) -> None:
        """One step of every parameter that has a gradient, at `self.lr`."""
        groups: dict[tuple[torch.device, torch.dtype], list[torch.nn.Parameter]] = {}
        for param in self.params:
            if param.grad is not None:
                groups.setdefault((param.device, param.dtype), []).append(param)
        for (device, _), params in groups.items():
            states = [self._state_of(p) for p in params]
            steps = [s["step"] for s in states]
            grad_scale = None if self.grad_scale is None else self.grad_scale.to(device, non_blocking=True)
            found_inf = None if self.found_inf is None else self.found_inf.to(device, non_blocking=True)
            torch._foreach_add_(steps, 1)
            torch._fused_adamw_(params, [p.grad for p in params], [s["exp_avg"] for s in states],
                                [s["exp_avg_sq"] for s in states], [], steps, amsgrad=False, lr=self.lr,
                                beta1=self.betas[0], beta2=self.betas[1], weight_decay=self.weight_decay,
                                eps=self.eps, maximize=False, grad_scale=grad_scale, found_inf=found_inf)
            if found_inf is not None:  # a skipped step does not count
                torch._foreach_sub_(steps, [found_inf] * len(steps))

    def zero_grad(self, set_to_none: bool = True) -> None:
        if set_to_none:
            for param in self.params:
                param.grad = None
            return
        grads = [param.grad for param in self.params if param.grad is not None]
        if grads:
            torch._foreach_zero_(grads)  # one launch per device, not one per parameter

    def state_dict(self) -> dict[str, Any]:
        """torch.optim.AdamW's layout: state by parameter index, one parameter group."""
        return {"state": {index: dict(self.state[p]) for index, p in enumerate(self.params) if self.state.get(p)},
                "param_groups": [{"lr": self.lr, "betas": self.betas, "eps": self.eps,
                                  "weight_decay": self.weight_decay, "amsgrad": False, "maximize": False,
                                  "foreach": None, "capturable": False, "differentiable": False, "fused": True,
                                  "decoupled_weight_decay": True, "params": list(range(len(self.params)))}]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A state_dict of this class or of torch.optim.AdamW over the same parameters."""
        groups = state_dict["param_groups"]
        indices = [index for group in groups for index in group["params"]]
        if len(indices) != len(self.params):
            raise ValueError(f"the optimizer state holds {len(indices)} parameters, this stage has {len(self.params)}")
        by_index = dict(zip(indices, self.params, strict=True))
        self.state = {}
        for index, saved in state_dict["state"].items():
            param = by_index[int(index)]
            for key in ("exp_avg", "exp_avg_sq"):
                if key in saved and saved[key].shape != param.shape:
                    raise ValueError(f"optimizer state {key} of parameter {index} has shape "
                                     f"{tuple(saved[key].shape)}, the parameter {tuple(param.shape)}")
            # As torch.optim loads a fused optimizer's state: moments in the parameter's dtype,
            # the step count in float32, all on the parameter's device.
            self.state[param] = {key: value.to(dtype=torch.float32 if key == "step" else param.dtype,
                                               device=param.device) for key, value in saved.items()}
        self.lr = groups[0]["lr"]
