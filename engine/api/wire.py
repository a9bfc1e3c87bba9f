"""The wire schema between router, decode and prefill: typed msgspec structs for the HTTP
bodies the router sends a decode node and for the first-contact handshake on the ZMQ control
channel (the KV-transfer messages themselves are in `engine.transfer.messages`), and the protocol
version they speak.

The rules, for a rolling upgrade (docs/security.md, "Wire schema"):

- A field a peer does not know is ignored (msgspec's default, kept on purpose): a newer
  router or decode node may add an optional field with a default that means "as before".
- Anything a peer of the previous version would misread (a field renamed, retyped or given a
  new meaning) bumps `PROTOCOL_VERSION`. A decode node answers a body of another version 400;
  prefill and decode nodes of other versions never pair (`Fingerprint`).
- A missing field takes its default; a value of the wrong type, an out-of-range number or a
  malformed endpoint is a `msgspec.ValidationError` naming the field's path.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

from tandem.engine.core.sampling_params import SamplingParams

# 1: untyped sampling dictionaries, no handshake. 2: this module.
PROTOCOL_VERSION = 2

# A prefill worker's endpoint, as routers name it: tcp://host:port (an IPv6 host in
# brackets, a port in 1..65535). Anything else is refused before it reaches a socket.
_PORT = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
ENDPOINT_PATTERN = rf"^tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):{_PORT}$"
Endpoint = Annotated[str, msgspec.Meta(pattern=ENDPOINT_PATTERN, max_length=300)]
# Prefill alternates a body may name (a deployment has a handful of prefill workers).
MAX_ALTERNATES = 64

# What each side of the handshake proves over the decode node's nonce (`DeploymentToken`).
HELLO_LABEL = "decode-hello"
WELCOME_LABEL = "prefill-welcome"

RequestId = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class GenerateBody(msgspec.Struct, frozen=True):
    """`POST /generate` on a decode node: run `token_ids` with `sampling`, its prompt
    prefilled by the worker at `prefill` (None: here), failing over to `prefill_alternates`."""

    request_id: RequestId
    token_ids: list[int]
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    prefill: Endpoint | None = None
    prefill_alternates: Annotated[list[Endpoint], msgspec.Meta(max_length=MAX_ALTERNATES)] = []
    cache_salt: str | None = None
    protocol: int = PROTOCOL_VERSION


class ProtocolMismatch(msgspec.ValidationError):
    """A body of another `PROTOCOL_VERSION`: a peer from across a rolling upgrade."""


class AbortBody(msgspec.Struct, frozen=True):
    """`POST /abort` on a decode node."""

    request_id: RequestId


class Fingerprint(msgspec.Struct, frozen=True):
    """What two nodes must share to exchange KV blocks: a prefill node's blocks are read by
    the decode node as its own, so any difference here corrupts the output silently."""

    protocol: int
    model: str
    revision: str
    dtype: str
    block_size: int
    kv_layout: str  # layers x K,V x total KV heads x head dim; the split across ranks aside

    def mismatch(self, other: Fingerprint) -> str | None:
        """The first field (in declaration order) on which `other` differs, or None."""
        for name in self.__struct_fields__:
            if getattr(self, name) != getattr(other, name):
                return name
        return None

    def describe(self, other: Fingerprint, name: str) -> str:
        return f"{name}: {getattr(self, name)!r} here, {getattr(other, name)!r} there"


class Hello(msgspec.Struct, frozen=True, tag="hello"):
    """A decode node's first message on a new connection: who it is, and a proof that it
    holds the deployment's token (`DeploymentToken.proof`, over `nonce`)."""

    fingerprint: Fingerprint
    nonce: bytes
    proof: bytes


class Welcome(msgspec.Struct, frozen=True, tag="welcome"):
    """The prefill node's answer: its fingerprint and its own proof over the `Hello`'s
    nonce (echoed: an answer to an earlier connection's `Hello` is told apart). Only then
    does the decode node send it its agent metadata and KV addresses."""

    fingerprint: Fingerprint
    nonce: bytes
    proof: bytes
    agent: str  # its NIXL agent: the only sender of its `PrefillDone` notifications
    role: str = "prefill"


class PairingRefused(msgspec.Struct, frozen=True, tag="refused"):
    """The prefill node will not pair: `reason` is a `Fingerprint` field or "token"."""

    reason: str
    detail: str


_json_generate = msgspec.json.Decoder(GenerateBody)
_json_abort = msgspec.json.Decoder(AbortBody)


def decode_generate(body: bytes) -> GenerateBody:
    """Raises msgspec.DecodeError (a ValidationError for a well-formed body of the wrong
    shape) with the offending field's path, or ProtocolMismatch."""
    decoded = _json_generate.decode(body)
    if decoded.protocol != PROTOCOL_VERSION:
        raise ProtocolMismatch(
            f"wire protocol {decoded.protocol} is not spoken here (this node: {PROTOCOL_VERSION})"
        )
    return decoded


def decode_abort(body: bytes) -> AbortBody:
    return _json_abort.decode(body)


def error_param(exc: msgspec.DecodeError) -> str | None:
    """The dotted path of the field a ValidationError names (`$.a[1].b` -> `a.1.b`)."""
    match = re.search(r"at `\$\.?([^`]*)`$", str(exc))
    if match is None or not match.group(1):
        return None
    return re.sub(r"\[(\d+)\]", r".\1", match.group(1)).strip(".")


def error_message(exc: msgspec.DecodeError) -> str:
    """The error, its endpoint pattern named in words."""
    return re.sub(r"matching regex '[^']*'", "of the form tcp://host:port", str(exc))
