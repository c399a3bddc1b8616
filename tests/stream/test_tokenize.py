"""braid.stream.tokenize: small requests tokenize inline, large ones on one worker thread at a time,
and the Trio thread keeps running while a large one tokenizes."""

from __future__ import annotations

import json
import threading

import pytest
import trio

from braid.engine.scripted import ByteTokenizer
from braid.stream.tokenize import INLINE_CHARS, encode_prompts, text_prompts
from braid.wire.completions_request import parse_request
from braid.wire.fields import Limits
from tests.helpers import RecordingTokenizer, big_batch

TOK = ByteTokenizer()


def req(prompt: object, **body: object):  # type: ignore[no-untyped-def]
    return parse_request(json.dumps({"prompt": prompt, **body}).encode(), Limits(vocab_size=TOK.vocab_size))


async def test_a_small_request_is_encoded_inline() -> None:
    tok = RecordingTokenizer()
    out = await encode_prompts(req(["ab", "c"]), tok, trio.CapacityLimiter(1))
    assert out == {0: tuple(TOK.encode("ab")), 1: tuple(TOK.encode("c"))}
    assert tok.threads == ["inline", "inline"]


async def test_a_large_batch_is_encoded_on_a_worker_thread_with_the_same_ids() -> None:
    tok = RecordingTokenizer()
    prompts = big_batch()
    assert sum(map(len, prompts)) > INLINE_CHARS
    for special in (True, False):
        tok.threads.clear()
        out = await encode_prompts(req(prompts, add_special_tokens=special), tok, trio.CapacityLimiter(1))
        assert out == {i: tuple(TOK.encode(p, add_special_tokens=special)) for i, p in enumerate(prompts)}
        assert tok.threads == ["many:worker"]


async def test_token_prompts_are_not_tokenized() -> None:
    tok = RecordingTokenizer()
    assert await encode_prompts(req([[5, 6], [7]]), tok, trio.CapacityLimiter(1)) == {}
    assert text_prompts(req("hi")) == {0: "hi"}
    assert tok.threads == []


async def test_the_trio_thread_runs_while_a_large_batch_tokenizes() -> None:
    gate = threading.Event()
    tok = RecordingTokenizer(gate)
    ran = []

    async def other_stream() -> None:
        await trio.sleep(0.01)
        ran.append(True)
        gate.set()  # tokenizing can finish only once this task has run

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_stream)
        out = await encode_prompts(req(big_batch()), tok, trio.CapacityLimiter(1))
    assert ran and len(out) == 64


async def test_large_batches_tokenize_one_at_a_time() -> None:
    gate = threading.Event()
    tok = RecordingTokenizer(gate)
    limiter = trio.CapacityLimiter(1)
    results = []

    async def one() -> None:
        results.append(await encode_prompts(req(big_batch()), tok, limiter))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(one)
        await trio.sleep(0.05)
        gate.set()
    assert len(results) == 3 and tok.most_active == 1


async def test_a_cancelled_request_waits_for_its_thread_then_sees_the_cancellation() -> None:
    gate = threading.Event()
    tok = RecordingTokenizer(gate)
    limiter = trio.CapacityLimiter(1)
    scope = trio.CancelScope()

    async def cancel_then_release() -> None:
        await trio.sleep(0.01)
        scope.cancel()
        await trio.sleep(0.05)
        assert limiter.borrowed_tokens == 1  # still tokenizing: the wait was not abandoned
        gate.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_then_release)
        with scope:
            await encode_prompts(req(big_batch()), tok, limiter)
            pytest.fail("a cancelled request went on past tokenizing")
    assert scope.cancelled_caught
    assert limiter.borrowed_tokens == 0 and tok.active == 0  # no thread left behind
