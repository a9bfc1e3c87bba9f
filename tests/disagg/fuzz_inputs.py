"""Hypothesis strategies for what a peer may send a node's ports: JSON bodies and headers for
the HTTP routes, msgpack frames for the ZMQ sockets, bytes for NIXL notifications.

Each starts from a well-formed message (what an authenticated peer sends) and mutates it:
a field dropped, added or replaced by junk (wrong types, nested junk, a huge list or
string), a request id replayed from a small pool, the whole message replaced by other
JSON, a truncated encoding or random bytes. Sizes are bounded so a CI run stays short; the
bench (`bench/fuzz_nodes.py`) draws more of the same.
"""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec
from hypothesis import strategies as st

from tandem.engine.transfer.messages import (
    AbortAck,
    AbortPrefill,
    AgentInfo,
    KVLayout,
    PrefillDone,
    PrefillFailed,
    PrefillRequest,
)

# A few ids, so that some examples replay the id of one before (a live one: a 409 or a
# prefill job key already in use).
REQUEST_IDS = ("r0", "r1", "r2")
VOCAB = 64  # a token id below this is in every test model's vocabulary
BLOCK_SIZE = 16  # the nodes' default
HUGE_LEN = 20_000  # a list or string this long: past every limit, cheap to send

INT64 = st.integers(-(2**63), 2**64 - 1)  # what msgpack can carry
JSON_LEAF = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
)
MSGPACK_LEAF = (
    st.none() | st.booleans() | INT64 | st.floats() | st.text(max_size=12) | st.binary(max_size=12)
)


def nested(leaf: st.SearchStrategy) -> st.SearchStrategy:
    """`leaf` values, and small lists and maps of them, nested."""
    return st.recursive(
        leaf,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
        ),
        max_leaves=8,
    )


JSON_JUNK = nested(JSON_LEAF)
MSGPACK_JUNK = nested(MSGPACK_LEAF)
HUGE = st.sampled_from(
    [[1] * HUGE_LEN, list(range(HUGE_LEN)), "x" * HUGE_LEN, {str(i): i for i in range(2_000)}]
)
REQUEST_ID = st.sampled_from(REQUEST_IDS) | st.text(max_size=8)
TOKEN_IDS = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40)


def mutated(base: dict[str, Any], junk: st.SearchStrategy = JSON_JUNK) -> st.SearchStrategy[dict]:
    """`base` itself, or with one field dropped, one added, or one replaced by junk."""
    keys = sorted(base)
    return st.one_of(
        st.just(base),
        st.sampled_from(keys).map(lambda k: {f: v for f, v in base.items() if f != k}),
        st.tuples(st.text(max_size=10), junk).map(lambda kv: {**base, kv[0]: kv[1]}),
        st.tuples(st.sampled_from(keys), junk | HUGE).map(lambda kv: {**base, kv[0]: kv[1]}),
    )


@st.composite
def sampling(draw: st.DrawFn, junk: st.SearchStrategy = JSON_JUNK) -> dict[str, Any]:
    """Sampling parameters that end soon (streams are read a few records, then closed),
    mutated like everything else: a knob the node does not know, a value of a wrong type."""
    base = {
        "max_tokens": draw(st.integers(1, 4)),
        "temperature": draw(st.sampled_from([0.0, 0.7, 1.0])),
        "ignore_eos": draw(st.booleans()),
    }
    knobs = ["top_p", "top_k", "min_p", "seed", "logprobs", "stop", "stop_token_ids", "n",
             "logit_bias", "min_tokens", "repetition_penalty", "structured_outputs"]  # fmt: skip
    extra = draw(st.dictionaries(st.sampled_from(knobs), junk, max_size=2))
    return draw(mutated({**base, **extra}, junk))


def generate_body(prefills: list[str | None], mutate: bool = True) -> st.SearchStrategy[dict]:
    """A `/generate` body naming one of `prefills` (None: prefill locally), then mutated."""
    endpoint = st.sampled_from(prefills)
    knobs = sampling()
    if mutate:
        endpoint = endpoint | st.text(max_size=20)
    else:
        knobs = st.fixed_dictionaries({"max_tokens": st.integers(1, 4),
                                       "temperature": st.sampled_from([0.0, 1.0])})  # fmt: skip
    base = st.fixed_dictionaries(
        {"request_id": REQUEST_ID, "token_ids": TOKEN_IDS, "sampling": knobs,
         "prefill": endpoint},
        optional={"prefill_alternates": st.lists(endpoint, max_size=2),
                  "cache_salt": st.text(max_size=8)},
    )  # fmt: skip
    return base.flatmap(mutated) if mutate else base


def json_bytes(body: st.SearchStrategy[dict]) -> st.SearchStrategy[bytes]:
    """`body` as JSON mostly; else other JSON, a truncated body, or bytes that are not JSON."""
    encoded = body.map(lambda b: json.dumps(b).encode())
    truncated = st.tuples(encoded, st.floats(0, 1)).map(lambda t: t[0][: int(len(t[0]) * t[1])])
    return st.one_of(
        encoded,
        encoded,
        encoded,
        JSON_JUNK.map(lambda j: json.dumps(j).encode()),
        truncated,
        st.binary(max_size=64),
    )


HEADER_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=80)
# `authorization` replaces the sender's token: junk, another token, none at all
HEADERS = st.dictionaries(
    st.sampled_from(["x-request-id", "traceparent", "tracestate", "content-type", "authorization"]),
    HEADER_TEXT | st.just("x" * 4000) | st.just("Bearer not-the-deployment-token") | st.just(""),
    max_size=2,
)

# Every route a node has, and some it has not; methods right and wrong.
PATHS = ("/generate", "/abort", "/health", "/health/live", "/metrics", "/kv/snapshot",
         "/debug/kv", "/debug/steps", "/debug/blocks", "/debug/x", "/nope",
         "/generate/x")  # fmt: skip
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")


class HttpCall(msgspec.Struct, frozen=True):
    """One HTTP message: method, path with query, headers, raw body."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


def query(path: str) -> st.SearchStrategy[str]:
    junk = st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=12)
    return st.one_of(
        st.just(path),
        st.integers(-(2**70), 2**70).map(lambda n: f"{path}?since={n}"),
        junk.map(lambda q: f"{path}?since={q}"),
    )


def http_call(prefills: list[str | None]) -> st.SearchStrategy[HttpCall]:
    """Mostly `/generate`, then `/abort`, the debug views, and any route with any method."""
    generate = json_bytes(generate_body(prefills))
    valid = generate_body(prefills, mutate=False).map(lambda b: json.dumps(b).encode())
    abort = json_bytes(st.fixed_dictionaries({"request_id": REQUEST_ID}).flatmap(mutated))
    blocks = json_bytes(
        st.fixed_dictionaries({"hashes": st.lists(INT64, max_size=40)}).flatmap(mutated)
    )
    return st.one_of(
        st.builds(HttpCall, st.just("POST"), st.just("/generate"), HEADERS, generate),
        st.builds(HttpCall, st.just("POST"), st.just("/generate"), HEADERS, generate),
        st.builds(HttpCall, st.just("POST"), st.just("/generate"), st.just({}), valid),
        st.builds(HttpCall, st.just("POST"), st.just("/abort"), HEADERS, abort),
        st.builds(HttpCall, st.just("POST"), st.just("/debug/blocks"), HEADERS, blocks),
        st.builds(HttpCall, st.sampled_from(METHODS), query("/debug/steps"), HEADERS, st.just(b"")),
        st.builds(HttpCall, st.sampled_from(METHODS), st.sampled_from(PATHS), HEADERS,
                  st.binary(max_size=32)),
    )  # fmt: skip


# -- msgpack frames ---------------------------------------------------------------------


def layout(num_blocks: int = 8) -> KVLayout:
    return KVLayout(base_addr=4096, block_bytes=4096, num_blocks=num_blocks, device_id=0,
                    mem_type="DRAM")  # fmt: skip


def builtins(message: msgspec.Struct) -> dict[str, Any]:
    """A struct as the map msgpack carries (its tag under "type"), for mutating."""
    return msgspec.to_builtins(message, builtin_types=(bytes,))


def encoded(message: st.SearchStrategy[dict]) -> st.SearchStrategy[bytes]:
    return message.map(msgspec.msgpack.encode)


def frames(valid: st.SearchStrategy[dict]) -> st.SearchStrategy[list[bytes]]:
    """ZMQ messages (lists of frames): `valid` mutated and encoded mostly; else a wrong tag,
    a truncated frame, random bytes, an empty frame, or several frames at once."""
    tag = st.sampled_from(["prefill", "abort", "done", "failed", "abort_ack", "", "x"])
    data = encoded(valid.flatmap(lambda m: mutated(m, MSGPACK_JUNK)))
    retagged = encoded(st.tuples(valid, tag).map(lambda t: {**t[0], "type": t[1]}))
    truncated = st.tuples(data, st.floats(0, 1)).map(lambda t: t[0][: int(len(t[0]) * t[1])])
    one = st.one_of(data, data, data, retagged, truncated, st.binary(max_size=64), st.just(b""))
    return st.one_of(
        one.map(lambda f: [f]), one.map(lambda f: [f]), st.lists(one, min_size=2, max_size=3)
    )


def agent_info(known: list[AgentInfo]) -> st.SearchStrategy[AgentInfo]:
    """A real agent (`known`: its metadata loads) or one with junk metadata."""
    junk = st.builds(
        AgentInfo,
        st.sampled_from(["fuzz-agent"]) | st.text(max_size=8),
        st.binary(max_size=64),
        st.builds(layout, st.integers(0, 64)),
    )
    return st.sampled_from(known) | junk if known else junk


@st.composite
def prefill_request(draw: st.DrawFn, known: list[AgentInfo]) -> dict[str, Any]:
    """A `PrefillRequest` as a map: a real or a junk agent; destination blocks that fit the
    prompt (for a real agent the worker prefills it, writes and notifies), or not."""
    token_ids = draw(TOKEN_IDS)
    skip = draw(st.integers(0, 2))
    fitting = range(skip, -(-len(token_ids) // BLOCK_SIZE))
    dst = draw(st.just(list(fitting)) | st.lists(st.integers(0, 10), max_size=4))
    msg = PrefillRequest(
        draw(REQUEST_ID), draw(st.integers(0, 3)), token_ids, draw(sampling(MSGPACK_JUNK)),
        skip, dst, draw(agent_info(known)), draw(st.sampled_from([60.0, 1e10, 0.0])),
        time.time(),
    )  # fmt: skip
    return builtins(msg)


def abort_prefill(known: list[AgentInfo]) -> st.SearchStrategy[dict]:
    names = st.sampled_from([a.name for a in known] or ["fuzz-agent"]) | st.text(max_size=8)
    return st.builds(AbortPrefill, REQUEST_ID, st.integers(0, 3), names).map(builtins)


def to_prefill_frames(known: list[AgentInfo]) -> st.SearchStrategy[list[bytes]]:
    """What a decode node sends a prefill worker's ROUTER, fuzzed."""
    return frames(prefill_request(known) | abort_prefill(known))


def from_prefill_frames(request_id: str, attempt: int) -> st.SearchStrategy[list[bytes]]:
    """What a prefill worker answers a decode node, fuzzed, about a live attempt or not."""
    ids = st.just(request_id) | REQUEST_ID
    attempts = st.just(attempt) | st.integers(-1, 4)
    failed = st.builds(PrefillFailed, ids, attempts, st.text(max_size=20))
    ack = st.builds(AbortAck, ids, attempts)
    return frames((failed | ack).map(builtins))


def notifications(request_id: str, attempt: int) -> st.SearchStrategy[bytes]:
    """NIXL notifications a decode node may hear: `PrefillDone`s with a first token inside
    the vocabulary or not, mutated, or junk."""
    done = st.builds(
        PrefillDone,
        st.just(request_id) | REQUEST_ID,
        st.just(attempt) | st.integers(-1, 4),
        st.integers(0, VOCAB - 1) | INT64,
        st.none(),
        st.integers(0, 4),
        st.integers(0, 2**20),
        st.floats(0, 1),
        st.floats(0, 1),
    ).map(builtins)
    return st.one_of(
        *(frames(done).map(lambda fs: fs[0]) for _ in range(3)), st.binary(max_size=64)
    )


def subscriptions() -> st.SearchStrategy[bytes]:
    """Frames an XSUB may send a PUB socket: (un)subscribe messages, and anything else."""
    return st.one_of(
        st.binary(max_size=32).map(lambda b: b"\x01" + b),
        st.binary(max_size=32).map(lambda b: b"\x00" + b),
        st.binary(max_size=64),
        st.just(b"\x01" + b"x" * HUGE_LEN),
    )
