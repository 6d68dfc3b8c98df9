"""Host copies for the wire (workers/device.py): on CPU the tensors themselves, ready at once;
on CUDA a side-stream copy into pinned memory with an event (run where a GPU is present)."""

from __future__ import annotations

import pytest
import torch

from workers.device import HostStaging, memory_fields


def test_on_cpu_the_wire_gets_the_tensors_themselves_ready_at_once():
    staging = HostStaging(torch.device("cpu"))
    activations = torch.randn(2, 3, 4)
    copy = staging.to_host([activations, activations.transpose(1, 2)])
    assert copy.ready is None
    assert copy.tensors[0].data_ptr() == activations.data_ptr()  # no copy at all
    assert copy.tensors[1].is_contiguous() and torch.equal(copy.tensors[1], activations.transpose(1, 2))
    received = torch.randn(5)
    assert staging.pinned(received) is received and staging.to_device(received) is received
    assert memory_fields(torch.device("cpu")) == {}


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device here: the side-stream copy is checked on GPU machines only")
def test_on_cuda_copies_run_on_a_side_stream_into_pinned_memory_without_a_clone():
    device = torch.device("cuda", 0)
    staging = HostStaging(device)
    values = torch.randn(64, 1024, device=device)
    expected = values.cpu()
    copy = staging.to_host([values * 2])
    assert copy.ready is not None
    copy.ready()
    assert copy.tensors[0].is_pinned() and torch.equal(copy.tensors[0], expected * 2)
    back = staging.to_device(copy.tensors[0])
    assert back.device == device and torch.equal(back.cpu(), expected * 2)
    assert memory_fields(device)["gpu_peak_mib"] > 0
