"""braid's deliberate deviations from vLLM's server, each a check of both sides' answers.

A deviation is asserted, not tolerated: its check says exactly what each server must do, so the
case fails if braid starts to match vLLM silently, if vLLM changes, or if the two differ in any
other way. Every key here is named in docs/compatibility.md (a test checks that).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from tests.parity.compare import Reply, diff, view

View = dict[str, Any]


@attrs.frozen
class Deviation:
    key: str
    summary: str
    # (braid, vllm, the request body) -> problems; [] = exactly as documented
    check: Callable[[Reply, Reply, Any], list[str]]


def _views(check: Callable[[View, View], list[str]]) -> Callable[[Reply, Reply, Any], list[str]]:
    return lambda braid, vllm, body: check(view(braid), view(vllm))


def _strict_types(braid: View, vllm: View) -> list[str]:
    problems = []
    if vllm["status"] != 200:
        problems.append(f"vLLM no longer coerces the value: status {vllm['status']}")
    if braid["status"] != 400 or braid.get("error", {}).get("type") != "Bad Request":
        problems.append(f"braid should refuse it with a 400 schema error, got {braid}")
    return problems


def _eager_validation(braid: View, vllm: View) -> list[str]:
    """vLLM streams a 200 whose only content is one error event and [DONE]; braid answers the
    same error (type, param, code) as a 400 before any stream starts."""
    problems = []
    stream = vllm.get("stream")
    if vllm["status"] != 200 or stream is None:
        return [f"vLLM no longer answers this with an in-stream error: {vllm}"]
    if stream["choices"] or stream["usage_chunks"] or stream["done"] != 1 or len(stream["errors"]) != 1:
        problems.append(f"vLLM's stream is not just one error event and [DONE]: {stream}")
    if braid["status"] != 400:
        problems.append(f"braid should refuse with a 400, got {braid['status']}")
    elif stream["errors"] and braid["error"] != stream["errors"][0]:
        problems.append(f"the errors differ: braid {braid['error']} vs vLLM {stream['errors'][0]}")
    return problems


def _detokenize_vocabulary(braid: View, vllm: View) -> list[str]:
    problems = []
    if vllm["status"] != 200:
        problems.append(f"vLLM no longer drops an out-of-vocabulary id: status {vllm['status']}")
    if braid["status"] != 400 or braid.get("error", {}).get("param") != "tokens":
        problems.append(f"braid should refuse the id with a 400 naming tokens, got {braid}")
    return problems


def _unsupported_fields(braid: View, vllm: View) -> list[str]:
    """vLLM honours the field; braid refuses it with a 400 naming it, never ignoring it."""
    problems = []
    if vllm["status"] != 200:
        problems.append(f"vLLM no longer honours the field: {vllm}")
    if braid["status"] != 400 or braid.get("error", {}).get("type") != "BadRequestError" or not braid["error"]["param"]:
        problems.append(f"braid should refuse with a 400 naming the field, got {braid}")
    return problems


def _batch_choices(body: Any) -> int:
    return len(body["messages"]) * (body.get("n") or 1)


def _vllm_batch_refuses_n(vllm: View, body: Any) -> list[str]:
    if (body.get("n") or 1) == 1:
        return []
    if vllm["status"] != 400 or vllm["error"] != {"type": "BadRequestError", "param": "n", "code": 400}:
        return [f"vLLM no longer refuses n > 1 on batched chat: {vllm}"]
    return []


def _batch_chat_n(braid: Reply, vllm: Reply, body: Any) -> list[str]:
    """vLLM refuses ``n > 1`` on /v1/chat/completions/batch; braid answers one chat.completion
    with conversations x n choices, indexed as completions index a batch (conversation * n + j)."""
    problems = _vllm_batch_refuses_n(view(vllm), body)
    if braid.status != 200 or braid.streamed or not isinstance(braid.body, dict):
        return [*problems, f"braid should answer a chat.completion body, got {view(braid)}"]
    b = braid.body
    want = _batch_choices(body)
    if b.get("object") != "chat.completion" or not str(b.get("id", "")).startswith("chatcmpl-"):
        problems.append(f"braid's body is not a chat.completion: object {b.get('object')!r}, id {b.get('id')!r}")
    choices = b.get("choices") or []
    if [ch.get("index") for ch in choices] != list(range(want)):
        problems.append(f"braid's choice indexes are {[ch.get('index') for ch in choices]}, not 0..{want - 1}")
    for ch in choices:
        msg = ch.get("message") or {}
        if msg.get("role") != "assistant" or not isinstance(msg.get("content"), str):
            problems.append(f"choice {ch.get('index')}: message {msg}")
        if ch.get("finish_reason") not in ("stop", "length"):
            problems.append(f"choice {ch.get('index')}: finish_reason {ch.get('finish_reason')!r}")
    usage = b.get("usage") or {}
    if usage.get("total_tokens") != usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0):
        problems.append(f"braid's usage does not add up: {usage}")
    return problems


def _batch_chat_stream(braid: Reply, vllm: Reply, body: Any) -> list[str]:
    """vLLM 0.32 has no ``stream`` field on batched chat: it ignores it and answers a JSON body
    built from each conversation's last delta only (or refuses ``n > 1`` first); braid streams
    chat.completion.chunk events, conversations x n indexes, each opened by a role chunk."""
    v = view(vllm)
    problems = _vllm_batch_refuses_n(v, body)
    if (body.get("n") or 1) == 1:
        vb = vllm.body if isinstance(vllm.body, dict) else {}
        if vllm.status != 200 or vllm.streamed or vb.get("object") != "chat.completion":
            problems.append(f"vLLM no longer ignores stream on batched chat: {v}")
        elif len(vb.get("choices") or []) != len(body["messages"]):
            problems.append(f"vLLM's ignored-stream body has {len(vb.get('choices') or [])} choices")
    if braid.status != 200 or not braid.streamed:
        return [*problems, f"braid should stream, got {view(braid)}"]
    s = view(braid)["stream"]
    want = _batch_choices(body)
    if s.get("objects") != ["chat.completion.chunk"]:
        problems.append(f"braid's chunks are {s.get('objects')}")
    if list(s["choices"]) != list(range(want)):
        problems.append(f"braid streamed indexes {list(s['choices'])}, not 0..{want - 1}")
    for i, acc in s["choices"].items():
        if acc.get("roles") != ["assistant"] or not acc.get("first_chunk_has_role"):
            problems.append(
                f"index {i}: roles {acc.get('roles')}, first chunk has role {acc.get('first_chunk_has_role')}"
            )
        if len(acc["finish_reasons"]) != 1 or acc["finish_reasons"][0] not in ("stop", "length"):
            problems.append(f"index {i}: finish reasons {acc['finish_reasons']}")
    if s["errors"] or s["done"] != 1 or s["events_after_done"]:
        problems.append(f"braid's stream: errors {s['errors']}, [DONE] x{s['done']}, {s['events_after_done']} after it")
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    if len(s["usage_chunks"]) != int(include_usage):
        problems.append(f"braid sent {len(s['usage_chunks'])} usage chunks, include_usage is {include_usage}")
    return problems


def _batch_chat_tools(braid: Reply, vllm: Reply, body: Any) -> list[str]:
    """vLLM's batched chat takes only ``tool_choice: "none"`` (a 400 otherwise); braid renders the
    tools and parses each conversation's calls, as its single-conversation route does, and
    refuses a bad ``tool_choice`` as that route does (param ``tool_choice``, not pydantic's)."""
    problems = []
    v = view(vllm)
    if v["status"] != 400:
        problems.append(f"vLLM's batched chat no longer refuses tool_choice: {v}")
    b = braid.body if isinstance(braid.body, dict) else {}
    if braid.status == 400:  # a tool_choice refused as the single-conversation route refuses it
        if view(braid).get("error", {}).get("param") != "tool_choice":
            problems.append(f"braid refused it for another reason: {view(braid)}")
        return problems
    if braid.status != 200 or braid.streamed or b.get("object") != "chat.completion":
        return [*problems, f"braid should answer a chat.completion, got {view(braid)}"]
    choices = b.get("choices") or []
    if len(choices) != _batch_choices(body):
        problems.append(f"braid answered {len(choices)} choices")
    for ch in choices:
        msg = ch.get("message") or {}
        calls = msg.get("tool_calls") or []
        if ch.get("finish_reason") == "tool_calls" and not calls and body.get("tool_choice") != "required":
            problems.append(f"choice {ch.get('index')}: finish_reason tool_calls without calls")
        for call in calls:
            if not str(call.get("id", "")).startswith("chatcmpl-tool-") or call.get("type") != "function":
                problems.append(f"choice {ch.get('index')}: call {call}")
            if ch.get("finish_reason") != "length":  # a cut call's arguments are cut JSON
                json.loads(call["function"]["arguments"])
    return problems


def _batch_chat_tool_history(braid: Reply, vllm: Reply, body: Any) -> list[str]:
    """With a tool parser on, vLLM 0.32's batched chat refuses a conversation whose history holds
    a tool call: it turns the call's JSON ``arguments`` into an object for the template, then
    validates the conversation again as a chat request, which wants a string (400, a pydantic
    error). Its single-conversation route takes the same history; braid's batch route does too."""
    problems = []
    if view(vllm)["status"] != 400:
        problems.append(f"vLLM's batched chat now takes a tool-call history: {view(vllm)}")
    b = braid.body if isinstance(braid.body, dict) else {}
    if (
        braid.status != 200
        or b.get("object") != "chat.completion"
        or len(b.get("choices") or []) != _batch_choices(body)
    ):
        problems.append(f"braid should answer every conversation, got {view(braid)}")
    return problems


def _batch_chat_reasoning_tokens(braid: View, vllm: View) -> list[str]:
    """With a reasoning parser, vLLM 0.32's batched chat leaves ``usage.completion_tokens_details``
    null (its single-conversation route reports ``reasoning_tokens``); braid's batch route reports
    them as its single route does. Otherwise the bodies match."""
    if vllm["status"] != 200 or braid["status"] != 200:
        return [f"both should answer 200: braid {braid['status']}, vLLM {vllm['status']}"]
    problems = []
    if vllm["body"]["usage"].get("completion_tokens_details") is not None:
        problems.append(f"vLLM's batched chat now reports {vllm['body']['usage']['completion_tokens_details']}")
    details = braid["body"]["usage"].get("completion_tokens_details")
    if not isinstance(details, dict) or not isinstance(details.get("reasoning_tokens"), int):
        problems.append(f"braid should report reasoning_tokens, got {details}")
    usage = {**braid["body"]["usage"], "completion_tokens_details": None}
    return problems + diff({**braid, "body": {**braid["body"], "usage": usage}}, vllm)


def _version_braid_version(braid: Reply, vllm: Reply, body: Any) -> list[str]:
    """``GET /version``: braid's ``version`` is vLLM's (the engine's), and it adds ``braid_version``."""
    import braid as braid_package

    problems = []
    if vllm.status != 200 or set(vllm.body or {}) != {"version"}:
        problems.append(f"vLLM's /version is no longer {{version}}: {vllm.status} {vllm.body}")
    expected = {**(vllm.body or {}), "braid_version": braid_package.__version__}
    if braid.status != 200 or braid.body != expected:
        problems.append(f"braid's /version should be {expected}, got {braid.status} {braid.body}")
    return problems


def _tokenizer_pool_class(braid: View, vllm: View) -> list[str]:
    """``GET /tokenizer_info``: vLLM's ``tokenizer_class`` names the thread-pool subclass its server
    wraps its tokenizer in (``TokenizerPool`` + the class); braid's names the tokenizer it holds.
    Every other field matches."""
    if vllm["status"] != 200 or braid["status"] != 200:
        return [f"both should answer 200: braid {braid['status']}, vLLM {vllm['status']}"]
    ours, theirs = braid["body"]["tokenizer_class"], vllm["body"]["tokenizer_class"]
    problems = [] if theirs == "TokenizerPool" + ours else [f"tokenizer_class: braid {ours!r}, vLLM {theirs!r}"]
    return problems + diff({**braid["body"], "tokenizer_class": theirs}, vllm["body"])


def _request_id_names_the_response(braid: Reply, vllm: Reply, body: Any) -> list[str]:
    """With --enable-request-id-headers and no client id, vLLM's X-Request-Id on a generating
    route is a new random id; braid's is the response's ``id``. The answers match otherwise."""
    problems = diff(
        {k: v for k, v in view(braid).items() if k != "headers"},
        {k: v for k, v in view(vllm).items() if k != "headers"},
    )
    if view(vllm).get("headers") != {"x-request-id": "<32 hex digits>"}:
        problems.append(f"vLLM's id is no longer a new uuid4: {vllm.headers}")
    braid_id = dict(braid.headers).get("x-request-id")
    if braid.status != 200 or braid_id != braid.body.get("id"):
        problems.append(f"braid's X-Request-Id should be the response's id, got {braid_id}")
    return problems


def _messages_schema_error_shape(braid: Reply, vllm: Reply, body: Any) -> list[str]:
    """vLLM answers a Messages body its pydantic schema refuses from its framework, in its OpenAI
    error shape; braid answers every error of the route in Anthropic's. Same status and type."""
    problems = []
    vllm_error = vllm.body.get("error") if isinstance(vllm.body, dict) else None
    if vllm.status != 400 or not isinstance(vllm_error, dict) or "code" not in vllm_error:
        problems.append(f"vLLM no longer answers this with its OpenAI-shaped 400: {vllm.status} {vllm.body}")
    if braid.status != 400 or not isinstance(braid.body, dict) or braid.body.get("type") != "error":
        problems.append(f"braid should answer a 400 in Anthropic's shape, got {braid.status} {braid.body}")
    elif isinstance(vllm_error, dict) and braid.body["error"].get("type") != vllm_error.get("type"):
        problems.append(f"the error types differ: braid {braid.body['error']} vs vLLM {vllm_error}")
    return problems


def _responses_function_tools_only(braid: Reply, vllm: Reply, body: Any) -> list[str]:
    """``/v1/responses`` with a tool that is not a function tool (``web_search_preview``...): vLLM
    without its tool server ignores it and answers; braid refuses it with a 400 naming ``tools``
    rather than leave out a tool the client counts on."""
    problems = []
    if vllm.status != 200:
        problems.append(f"vLLM no longer ignores the tool: status {vllm.status}")
    error = (braid.body or {}).get("error", {}) if isinstance(braid.body, dict) else {}
    if braid.status != 400 or error.get("param") != "tools":
        problems.append(f"braid should refuse the tool with a 400 naming tools, got {braid.status} {error}")
    return problems


def _without_logprobs(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_logprobs(v) for k, v in value.items() if k != "logprobs"}
    if isinstance(value, list):
        return [_without_logprobs(v) for v in value]
    return value


def _completed_logprobs(view: View) -> tuple[list[tuple[str, float]], int]:
    """The (token, logprob) pairs of a stream's ``response.completed`` message, and its output tokens."""
    done = [e for e in view["stream"]["events"] if e.get("type") == "response.completed"][-1]["response"]
    pairs = [
        (e["token"], e["logprob"])
        for item in done["output"]
        for part in item.get("content") or []
        for e in part.get("logprobs") or []
    ]
    return pairs, done["usage"]["output_tokens"]


def _responses_stream_logprobs(braid: Reply, vllm: Reply, body: Any) -> list[str]:
    """A streamed ``/v1/responses`` with logprobs: braid lists every token's logprob (a token with
    no text of its own, part of a character or a special token skipped, goes with the next text,
    or closes the message); vLLM drops those of such tokens, unless its consumer lagged and the
    token's output was merged with the next one's. Everything but the logprobs is the same; when
    no token lacks text (most machines, for this case) the two match exactly."""
    from tests.parity.responses_compare import view as responses_view

    b, v = responses_view(braid), responses_view(vllm)
    if b.get("status") != 200 or v.get("status") != 200 or "stream" not in b or "stream" not in v:
        return [f"both should stream: braid {b.get('status')}, vLLM {v.get('status')}"]
    problems = diff(_without_logprobs(b), _without_logprobs(v))
    ours, tokens = _completed_logprobs(b)
    theirs, _ = _completed_logprobs(v)
    if len(ours) != tokens:
        problems.append(f"braid lists {len(ours)} logprobs for {tokens} tokens")
    rest = iter(ours)
    if not all(pair in rest for pair in theirs):  # vLLM's are braid's, some left out
        problems.append(f"vLLM's logprobs {theirs} are not braid's {ours} with some left out")
    return problems


DEVIATIONS: dict[str, Deviation] = {
    d.key: d
    for d in (
        Deviation(
            "strict_types",
            'JSON values of the wrong type (a float token id 2.0, max_tokens "5", n 1.0) are refused, not coerced',
            _views(_strict_types),
        ),
        Deviation(
            "eager_validation",
            "errors vLLM's engine finds after a stream started are a 400 before it starts",
            _views(_eager_validation),
        ),
        Deviation(
            "unsupported_fields",
            "an output-changing field braid does not implement is refused, not ignored",
            _views(_unsupported_fields),
        ),
        Deviation(
            "detokenize_vocabulary",
            "/detokenize refuses an id outside the vocabulary (vLLM drops it silently)",
            _views(_detokenize_vocabulary),
        ),
        Deviation(
            "batch_chat_n",
            "/v1/chat/completions/batch takes n > 1 (vLLM refuses it): conversations x n choices",
            _batch_chat_n,
        ),
        Deviation(
            "batch_chat_stream",
            "/v1/chat/completions/batch streams (vLLM ignores stream and answers each last delta)",
            _batch_chat_stream,
        ),
        Deviation(
            "batch_chat_tools",
            "/v1/chat/completions/batch takes tool_choice auto, required and named (vLLM: only none)",
            _batch_chat_tools,
        ),
        Deviation(
            "batch_chat_tool_history",
            "/v1/chat/completions/batch takes a tool-call history with a tool parser on (vLLM 0.32: 400, its bug)",
            _batch_chat_tool_history,
        ),
        Deviation(
            "batch_chat_reasoning_tokens",
            "/v1/chat/completions/batch reports reasoning_tokens in usage (vLLM 0.32: null there)",
            _views(_batch_chat_reasoning_tokens),
        ),
        Deviation(
            "tokenizer_pool_class",
            "GET /tokenizer_info names braid's tokenizer class (vLLM: its TokenizerPool wrapper's)",
            _views(_tokenizer_pool_class),
        ),
        Deviation(
            "version_braid_version",
            "GET /version adds braid_version beside vLLM's version (the engine's vLLM)",
            _version_braid_version,
        ),
        Deviation(
            "messages_schema_error_shape",
            "/v1/messages: a body its schema refuses is a 400 in Anthropic's error shape (vLLM: its OpenAI shape)",
            _messages_schema_error_shape,
        ),
        Deviation(
            "request_id_names_the_response",
            "X-Request-Id made by the server on a generating route is the response's id (vLLM: a new uuid4)",
            _request_id_names_the_response,
        ),
        Deviation(
            "responses_stream_logprobs",
            "a streamed Responses answer lists every token's logprob, a token without text of its own too",
            _responses_stream_logprobs,
        ),
        Deviation(
            "responses_function_tools_only",
            "/v1/responses refuses tools other than function tools (vLLM without a tool server ignores them)",
            _responses_function_tools_only,
        ),
    )
}
