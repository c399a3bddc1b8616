"""The server options that set a request's defaults (braid.routes.common.server_defaults), through
the completions and chat views: ``--enable-force-include-usage`` and ``--return-tokens-as-token-ids``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from braid.routes.body import CompletionStream
from braid.routes.chat import chat_completions
from braid.routes.common import JsonResponse, View
from braid.routes.completions import completions
from braid.settings import ServingOptions
from tests.helpers import parse_sse
from tests.routes.test_completions import JSON, read, send, state

COMPLETION: dict[str, Any] = {"prompt": ["Hello", "World"], "max_tokens": 3, "temperature": 0}
CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
ROUTES = [pytest.param(completions, COMPLETION, id="completions"), pytest.param(chat_completions, CHAT, id="chat")]


async def events(view: View, body: dict[str, Any], **serving: bool) -> list[Any]:
    r = await view(
        state(serving=ServingOptions(**serving)), read(json.dumps(body).encode()), content_type=JSON, request_id=None
    )
    assert isinstance(r, CompletionStream)
    return parse_sse(await send(r))


async def whole(view: View, body: dict[str, Any], **serving: bool) -> dict[str, Any]:
    r = await view(
        state(serving=ServingOptions(**serving)), read(json.dumps(body).encode()), content_type=JSON, request_id=None
    )
    assert isinstance(r, JsonResponse)
    assert r.status == 200, r.body
    out: dict[str, Any] = json.loads(r.body)
    return out


def usage_of(evs: list[Any]) -> tuple[list[Any], list[Any]]:
    """The usage-only chunks, and the usage of every chunk with choices."""
    chunks = [e for e in evs if isinstance(e, dict)]
    return [e["usage"] for e in chunks if not e["choices"]], [e.get("usage") for e in chunks if e["choices"]]


@pytest.mark.parametrize(("view", "body"), ROUTES)
@pytest.mark.parametrize("options", [None, {}, {"include_usage": False}])
async def test_force_include_usage_puts_usage_on_every_chunk_and_at_the_end(
    view: View, body: dict[str, Any], options: dict[str, Any] | None
) -> None:
    streamed = {**body, "stream": True} | ({"stream_options": options} if options is not None else {})
    final, per_chunk = usage_of(await events(view, streamed, force_include_usage=True))
    assert len(final) == 1 and final[0]["completion_tokens"] > 0
    assert per_chunk and all(u is not None and u["prompt_tokens"] > 0 for u in per_chunk)
    # what the same request gets without the option: no usage at all
    final, per_chunk = usage_of(await events(view, streamed))
    assert final == [] and all(u is None for u in per_chunk)


@pytest.mark.parametrize(("view", "body"), ROUTES)
async def test_force_include_usage_leaves_whole_answers_and_the_stream_options_check(
    view: View, body: dict[str, Any]
) -> None:
    assert (await whole(view, body, force_include_usage=True))["usage"]["total_tokens"] > 0
    bad = {**body, "stream_options": {"include_usage": True}}  # without stream: still vLLM's 400
    r = await view(
        state(serving=ServingOptions(force_include_usage=True)),
        read(json.dumps(bad).encode()),
        content_type=JSON,
        request_id=None,
    )
    assert isinstance(r, JsonResponse) and r.status == 400


def completion_tokens(body: dict[str, Any]) -> list[str]:
    return [t for c in body["choices"] for t in c["logprobs"]["tokens"]]


def chat_tokens(body: dict[str, Any]) -> list[str]:
    return [t["token"] for c in body["choices"] for t in c["logprobs"]["content"]]


@pytest.mark.parametrize(
    ("view", "body", "tokens"),
    [
        pytest.param(completions, {**COMPLETION, "logprobs": 1}, completion_tokens, id="completions"),
        pytest.param(chat_completions, {**CHAT, "logprobs": True, "top_logprobs": 1}, chat_tokens, id="chat"),
    ],
)
async def test_return_tokens_as_token_ids_is_the_default_a_request_may_override(
    view: View, body: dict[str, Any], tokens: Any
) -> None:
    as_ids = tokens(await whole(view, body, return_tokens_as_token_ids=True))
    assert as_ids and all(t.startswith("token_id:") and t.removeprefix("token_id:").isdigit() for t in as_ids)
    as_text = tokens(await whole(view, body))
    assert as_text and not any(t.startswith("token_id:") for t in as_text)
    # the request's own value wins, either way
    assert (
        tokens(await whole(view, {**body, "return_tokens_as_token_ids": False}, return_tokens_as_token_ids=True))
        == as_text
    )
    assert tokens(await whole(view, {**body, "return_tokens_as_token_ids": True})) == as_ids
