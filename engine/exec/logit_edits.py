"""The per-request edits to a step's logits, gathered on the host and applied in a few
batched tensor ops: logit bias, repetition/presence/frequency penalties, and the
`min_tokens` mask.

Each kind of edit is a list of (row, token) pairs built from the runner's copies of the
requests (`RequestState`); each list crosses to the device once (pinned, asynchronous on
CUDA), so a step costs no host sync per request however many requests ask for edits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tandem.engine.exec.request_state import RequestState


def host_tensor(values: Sequence, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor on `device` from host values, copied without a host sync on CUDA."""
    t = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


@dataclass
class _Pairs:
    rows: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def index(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return host_tensor(self.rows, torch.long, device), host_tensor(
            self.tokens, torch.long, device
        )


@dataclass
class LogitEdits:
    bias: _Pairs = field(default_factory=_Pairs)  # values: the bias
    seen: _Pairs = field(default_factory=_Pairs)  # values: the repetition penalty
    output: _Pairs = field(default_factory=_Pairs)  # one pair per output token
    masked: _Pairs = field(default_factory=_Pairs)
    presence: list[float] = field(default_factory=list)  # per row
    frequency: list[float] = field(default_factory=list)  # per row

    @classmethod
    def collect(cls, requests: Sequence[RequestState], vocab_size: int) -> LogitEdits:
        edits = cls()
        for row, request in enumerate(requests):
            edits._add(row, request, vocab_size)
        return edits

    def _add(self, row: int, request: RequestState, vocab: int) -> None:
        p = request.sampling_params
        for token, bias in (p.logit_bias or {}).items():
            if 0 <= token < vocab:
                _append(self.bias, row, token, bias)
        if p.repetition_penalty != 1.0:
            for token in set(request.all_token_ids):
                _append(self.seen, row, token, p.repetition_penalty)
        counted = bool(request.output_token_ids and (p.presence_penalty or p.frequency_penalty))
        self.presence.append(p.presence_penalty if counted else 0.0)
        self.frequency.append(p.frequency_penalty if counted else 0.0)
        if counted:
            for token in request.output_token_ids:
                _append(self.output, row, token, 1.0)
        # Under a grammar the grammar says where the output may end: masking its only
        # allowed token (EOS once complete) would leave nothing to sample.
        if request.num_output_tokens < p.min_tokens and not request.has_grammar:
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(request.eos_token_ids))
            for token in stops:
                if 0 <= token < vocab:
                    _append(self.masked, row, token, 0.0)

    def apply(self, logits: torch.Tensor) -> None:  # [S, V] float32, edited in place
        """Bias, then penalties (repetition over prompt and output; presence and frequency
        over output only), then the min_tokens mask, as each request alone would."""
        device = logits.device
        if self.bias.rows:
            values = host_tensor(self.bias.values, logits.dtype, device)
            logits.index_put_(self.bias.index(device), values, accumulate=True)
        if self.seen.rows:
            index = self.seen.index(device)
            penalty = host_tensor(self.seen.values, logits.dtype, device)
            vals = logits[index]
            logits[index] = torch.where(vals > 0, vals / penalty, vals * penalty)
        if self.output.rows:
            counts = torch.zeros_like(logits)  # [S, V]
            ones = torch.ones(len(self.output.rows), dtype=logits.dtype, device=device)
            counts.index_put_(self.output.index(device), ones, accumulate=True)
            frequency = host_tensor(self.frequency, logits.dtype, device)[:, None]
            presence = host_tensor(self.presence, logits.dtype, device)[:, None]
            logits -= frequency * counts + presence * (counts > 0).to(logits.dtype)
        if self.masked.rows:
            logits[self.masked.index(device)] = float("-inf")


def _append(pairs: _Pairs, row: int, token: int, value: float) -> None:
    pairs.rows.append(row)
    pairs.tokens.append(token)
    pairs.values.append(value)
