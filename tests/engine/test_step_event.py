"""`StepEvent`: what a NIXL write waits on before it reads a step's KV."""

from __future__ import annotations

import pytest
import torch

from tandem.engine.core.step_event import StepEvent


def test_on_the_cpu_there_is_nothing_to_wait_for():
    event = StepEvent.record(torch.device("cpu"))
    event.wait()
    event.wait()  # idempotent


@pytest.mark.gpu
def test_on_a_gpu_wait_returns_once_the_step_ran():
    a = torch.randn(4096, 4096, device="cuda")
    out = a @ a  # queued; the host does not wait for it
    event = StepEvent.record(out.device)
    event.wait()
    assert event._event.query()  # the device finished everything queued before the record
