"""The request matrix sent to both braid and vLLM's own server.

A case is a request plus what is expected of the pair of answers: a match, or one of the
deliberate deviations of ``deviations.py`` (each listed in docs/compatibility.md). Requests are
greedy (``temperature: 0``) unless a case is about sampling, where a ``seed`` makes both
servers draw the same tokens.
"""

from __future__ import annotations

from typing import Any

import attrs

MODEL = "braid-tiny"
TEXT = "def parse(self, data):"
TEXT2 = "import os\nimport sys\n"
TEXTS4 = ["class Foo:", "for i in range(10):", "return None", "    def __init__(self):"]
# Token-id prompts hold ids of the tiny model's 2048-token vocabulary; 0-2 are <s>, </s>, <pad>.
IDS = [300, 301, 302, 303, 304]
IDS2 = [[400, 401, 402], [500, 501], [600]]
SINGLE = [321]  # a one-token prompt (ids are not given a BOS)
SPECIALS = [0, 0, 0, 0, 0]
MIXED_SPECIALS = [0, 300, 1, 301, 2]


@attrs.frozen
class Case:
    name: str
    group: str
    body: Any  # a JSON value to send, or bytes sent as they are
    content_type: str = "application/json"
    deviation: str | None = None  # a key of deviations.DEVIATIONS
    path: str = "/v1/completions"  # the route the body is POSTed to
    method: str = "POST"  # GET: the body is not sent
    headers: tuple[tuple[str, str], ...] = ()  # request headers besides Content-Type
    response_headers: tuple[str, ...] = ()  # response headers compared (compare.header_view)

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))


def _req(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 8, "temperature": 0}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not _DROP}


_DROP = object()


def _cases() -> list[Case]:
    c: list[Case] = []

    def add(name: str, group: str, body: Any, **kw: Any) -> None:
        c.append(Case(name, group, body, **kw))

    # -- prompt shapes
    add("string", "shapes", _req(prompt=TEXT))
    add("list of strings", "shapes", _req(prompt=[TEXT, TEXT2]))
    add("token ids", "shapes", _req(prompt=IDS))
    add("list of token-id lists", "shapes", _req(prompt=IDS2))
    add("one-element list of strings", "shapes", _req(prompt=[TEXT]))
    add("one-element list of token ids", "shapes", _req(prompt=[IDS]))
    add(
        "strings of different lengths", "shapes", _req(prompt=TEXTS4 + [TEXT, TEXT2, "x", "if __name__ == '__main__':"])
    )
    add("duplicate prompts", "shapes", _req(prompt=[TEXT, TEXT, TEXT]))
    add("digit strings stay text", "shapes", _req(prompt=["1", "2"]))
    add("1024 prompts", "shapes", _req(prompt=[f"x = {i}" for i in range(1024)], max_tokens=2))
    add(
        "1024 token-id prompts, streamed",
        "shapes",
        _req(prompt=[[100 + i % 1000, 7 + i % 50] for i in range(1024)], max_tokens=2, stream=True),
    )
    # -- n and seeds
    add("n=3 seeded", "n", _req(prompt=TEXT, n=3, temperature=0.8, seed=7))
    add("n=3 seeded batch", "n", _req(prompt=[TEXT, TEXT2], n=3, temperature=0.8, seed=11))
    add("n=1 seeded sampling", "n", _req(prompt=TEXTS4, temperature=1.0, seed=3, max_tokens=12))
    add("n=3 seeded top_p/top_k", "n", _req(prompt=TEXT2, n=3, temperature=1.0, top_p=0.9, top_k=20, seed=5))
    add("n=2 seeded stream batch", "n", _req(prompt=[TEXT, TEXT2], n=2, temperature=0.7, seed=9, stream=True))
    # -- max_tokens
    add("max_tokens 0 with echo", "max_tokens", _req(prompt=TEXT, max_tokens=0, echo=True))
    add("max_tokens 0 with echo, batch", "max_tokens", _req(prompt=[TEXT, TEXT2], max_tokens=0, echo=True))
    add("max_tokens 0 with echo, token-id batch", "max_tokens", _req(prompt=IDS2, max_tokens=0, echo=True))
    add("max_tokens 0 with echo and logprobs", "max_tokens", _req(prompt=TEXT, max_tokens=0, echo=True, logprobs=1))
    add("max_tokens 1", "max_tokens", _req(prompt=TEXTS4, max_tokens=1))
    add("max_tokens null means 16", "max_tokens", _req(prompt=TEXT, max_tokens=None))
    add("max_tokens omitted", "max_tokens", _req(prompt=TEXT, max_tokens=_DROP))
    add("max_tokens fills the context", "max_tokens", _req(prompt=IDS, max_tokens=1019, ignore_eos=True))
    add("ignore_eos and min_tokens", "max_tokens", _req(prompt=TEXTS4, max_tokens=24, min_tokens=20))
    # -- stop strings and stop token ids
    add("stop string", "stop", _req(prompt=TEXTS4, max_tokens=24, stop=["\n"]))
    add(
        "stop strings, included in output",
        "stop",
        _req(prompt=TEXTS4, max_tokens=24, stop=["(", ":"], include_stop_str_in_output=True),
    )
    add("stop string, streamed", "stop", _req(prompt=TEXTS4, max_tokens=24, stop=["\n", " = "], stream=True))
    add("stop token ids", "stop", _req(prompt=TEXTS4, max_tokens=24, stop_token_ids=[13, 30, 198]))
    add(
        "stop token ids, streamed",
        "stop",
        _req(prompt=TEXTS4, max_tokens=24, stop_token_ids=[13, 30, 198], stream=True),
    )
    # -- echo x logprobs x single/multi-token prompts
    for echo in (False, True):
        for lp in (0, 1, 5):
            for label, prompt in (("one-token", SINGLE), ("multi-token", TEXT)):
                add(
                    f"echo={str(echo).lower()} logprobs={lp} {label}",
                    "echo/logprobs",
                    _req(prompt=prompt, echo=echo, logprobs=lp, max_tokens=4),
                )
    add("logprobs on a batch", "echo/logprobs", _req(prompt=TEXTS4, logprobs=2, max_tokens=4))
    add("echo on token ids", "echo/logprobs", _req(prompt=IDS2, echo=True, max_tokens=3))
    # special tokens in a token-id prompt are echoed (vLLM decodes the ids with them), so the
    # echoed text agrees with its text_offsets
    add(
        "echo of special tokens in token ids",
        "echo/logprobs",
        _req(prompt=SPECIALS, echo=True, logprobs=1, max_tokens=4),
    )
    add(
        "echo of special tokens in token ids, streamed",
        "echo/logprobs",
        _req(prompt=MIXED_SPECIALS, echo=True, logprobs=1, max_tokens=4, stream=True),
    )
    add(
        "echo of special tokens in token ids, skip_special_tokens false",
        "echo/logprobs",
        _req(prompt=MIXED_SPECIALS, echo=True, max_tokens=4, skip_special_tokens=False),
    )
    # -- prompt_logprobs
    add("prompt_logprobs=1", "prompt_logprobs", _req(prompt=[TEXT, TEXT2], prompt_logprobs=1, max_tokens=2))
    add("prompt_logprobs=0", "prompt_logprobs", _req(prompt=TEXT, prompt_logprobs=0, max_tokens=2))
    add(
        "prompt_logprobs=3 with echo and logprobs",
        "prompt_logprobs",
        _req(prompt=TEXT, prompt_logprobs=3, echo=True, logprobs=1, max_tokens=2),
    )
    # -- streams
    add("stream", "stream", _req(prompt=TEXT, stream=True))
    add("stream batch", "stream", _req(prompt=TEXTS4, stream=True, max_tokens=12))
    add("stream include_usage", "stream", _req(prompt=TEXTS4, stream=True, stream_options={"include_usage": True}))
    add(
        "stream include_usage + continuous_usage_stats",
        "stream",
        _req(prompt=TEXTS4, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}),
    )
    add(
        "stream continuous_usage_stats alone",
        "stream",
        _req(prompt=TEXT, stream=True, stream_options={"continuous_usage_stats": True}),
    )
    add("stream_options {}", "stream", _req(prompt=TEXT, stream=True, stream_options={}))
    add("stream include_usage false", "stream", _req(prompt=TEXT, stream=True, stream_options={"include_usage": False}))
    add("stream logprobs batch", "stream", _req(prompt=TEXTS4, stream=True, logprobs=2, max_tokens=6))
    add("stream echo", "stream", _req(prompt=[TEXT, TEXT2], stream=True, echo=True, max_tokens=4))
    add("stream echo on token ids", "stream", _req(prompt=IDS2, stream=True, echo=True, max_tokens=4))
    add(
        "stream echo + logprobs, one-token prompt",
        "stream",
        _req(prompt=SINGLE, stream=True, echo=True, logprobs=1, max_tokens=4),
    )
    add(
        "stream echo + logprobs, text prompt",
        "stream",
        _req(prompt=TEXT, stream=True, echo=True, logprobs=1, max_tokens=12),
    )
    add(
        "stream echo max_tokens 0",
        "stream",
        _req(prompt=[TEXT, TEXT2], stream=True, echo=True, max_tokens=0, stream_options={"include_usage": True}),
    )
    # -- return_token_ids
    add("return_token_ids", "return_token_ids", _req(prompt=[TEXT, TEXT2], return_token_ids=True))
    add("return_token_ids on token ids", "return_token_ids", _req(prompt=IDS2, return_token_ids=True))
    add("return_token_ids streamed", "return_token_ids", _req(prompt=[TEXT, TEXT2], return_token_ids=True, stream=True))
    add("return_token_ids with echo", "return_token_ids", _req(prompt=TEXT, return_token_ids=True, echo=True))
    # -- other sampling fields honoured by both
    add(
        "seeded repetition/presence penalties",
        "sampling",
        _req(prompt=TEXT2, temperature=0.9, seed=1, repetition_penalty=1.3, presence_penalty=0.5, max_tokens=12),
    )
    add("skip_special_tokens false", "sampling", _req(prompt=TEXT, skip_special_tokens=False, max_tokens=24))
    add("logit_bias", "sampling", _req(prompt=TEXT, logit_bias={"300": 100}, max_tokens=4))
    add("unknown fields are ignored", "sampling", _req(prompt=TEXT, user="u-1", some_unknown_field=3))
    add(
        "stream_interval 4, streamed batch",
        "sampling",
        _req(prompt=[TEXT, TEXT2], stream_interval=4, max_tokens=10, ignore_eos=True, stream=True),
    )
    add("stream_interval 0", "errors", _req(prompt=TEXT, stream_interval=0))
    add("seed over int64", "errors", _req(prompt=TEXT, seed=2**63))
    add("logit_bias with bad keys", "errors", _req(prompt=TEXT, logit_bias={"a": 1, "b": 2}))
    # -- errors: compared on status, error.type, error.param, error.code
    add("prompt []", "errors", _req(prompt=[]))
    add('prompt ""', "errors", _req(prompt=""))
    add("prompt missing", "errors", _req(prompt=_DROP))
    add("prompt [[]]", "errors", _req(prompt=[[]]))
    add("prompt [[1], []]", "errors", _req(prompt=[[5], []]))
    add("prompt [[]] streamed", "errors", _req(prompt=[[]], stream=True), deviation="eager_validation")
    add('mixed list [1, "a"]', "errors", _req(prompt=[1, "a"]))
    add('mixed list [[1], "a"]', "errors", _req(prompt=[[1], "a"]))
    add('nested strings [["a"]]', "errors", _req(prompt=[["a"]]))
    add("prompt is a number", "errors", _req(prompt=3))
    add("negative id [-1]", "errors", _req(prompt=[-1]))
    add("negative id [[5], [-1]]", "errors", _req(prompt=[[5], [-1]]))
    add("out-of-vocabulary id", "errors", _req(prompt=[999999]))
    add("out-of-vocabulary id in a batch", "errors", _req(prompt=[[5], [5, 2048]]))
    add(
        "out-of-vocabulary id, streamed",
        "errors",
        _req(prompt=[[5], [999999]], stream=True),
        deviation="eager_validation",
    )
    add("float token id 2.0", "errors", _req(prompt=[1, 2.0]), deviation="strict_types")
    # vLLM 0.32 shrinks max_tokens to the room a prompt leaves, and refuses only a prompt that
    # leaves none (max_model_len is 1024)
    add("prompt near the context: max_tokens shrinks", "max_tokens", _req(prompt=list(range(3, 1023)), max_tokens=16))
    add(
        "prompt near the context in a streamed batch",
        "max_tokens",
        _req(prompt=[[5], list(range(3, 1023))], max_tokens=16, stream=True),
    )
    add("min_tokens over max_tokens", "errors", _req(prompt=TEXT, max_tokens=4, min_tokens=5))
    add(
        "min_tokens over the shrunk max_tokens",
        "errors",
        _req(prompt=list(range(3, 1023)), max_tokens=16, min_tokens=10),
    )
    add("too-long prompt", "errors", _req(prompt=list(range(3, 1033)), max_tokens=16))
    add(
        "too-long prompt in a batch, streamed",
        "errors",
        _req(prompt=[[5], list(range(3, 1033))], max_tokens=16, stream=True),
    )
    add("prompt fills the context", "errors", _req(prompt=list(range(3, 1027)), max_tokens=16))
    add(
        "prompt fills the context, echo max_tokens 0",
        "errors",
        _req(prompt=list(range(3, 1027)), max_tokens=0, echo=True),
    )
    add(
        "prompt fills the context, echo max_tokens 0, streamed",
        "errors",
        _req(prompt=list(range(3, 1027)), max_tokens=0, echo=True, stream=True),
        deviation="eager_validation",
    )
    # -- truncate_prompt_tokens and the text-length bound (vLLM 0.32's TokenizeParams rules)
    long_ids = list(range(3, 1103))  # 1100 tokens
    add(
        "truncate token ids",
        "truncation",
        _req(prompt=IDS2, truncate_prompt_tokens=2, echo=True, return_token_ids=True, max_tokens=2),
    )
    add(
        "truncate token ids from the right",
        "truncation",
        _req(prompt=IDS2, truncate_prompt_tokens=2, truncation_side="right", return_token_ids=True, max_tokens=2),
    )
    add("truncate a text, echoed", "truncation", _req(prompt=TEXT, truncate_prompt_tokens=3, echo=True, max_tokens=2))
    add(
        "truncate token ids, echoed with special tokens",
        "truncation",
        _req(prompt=[[0, 300, 301, 1, 302], IDS], truncate_prompt_tokens=2, echo=True, logprobs=0, max_tokens=2),
    )
    add(
        "truncate a text from the left side",
        "truncation",
        _req(prompt=TEXT, truncate_prompt_tokens=3, truncation_side="left", return_token_ids=True, max_tokens=2),
    )
    add(
        "truncate a text, echoed with logprobs",
        "truncation",
        _req(prompt=TEXT, truncate_prompt_tokens=3, echo=True, logprobs=1, max_tokens=2),
    )
    add(
        "truncate -1: the context less one",
        "truncation",
        _req(prompt=long_ids, truncate_prompt_tokens=-1, max_tokens=5),
    )
    add(
        "truncate over the room max_tokens leaves",
        "truncation",
        _req(prompt=list(range(3, 103)), truncate_prompt_tokens=1000, max_tokens=100, ignore_eos=True),
    )
    add("truncate to the whole context", "errors", _req(prompt=long_ids, truncate_prompt_tokens=1024, max_tokens=5))
    add("truncate over the context", "errors", _req(prompt=long_ids, truncate_prompt_tokens=1025, max_tokens=5))
    add("truncation_side not left or right", "errors", _req(prompt=IDS, truncation_side="middle"))
    add("text over the character bound", "errors", _req(prompt="x" * 40000, max_tokens=5))
    add("text over the character bound in a batch", "errors", _req(prompt=[TEXT, "x" * 40000], max_tokens=5))
    add(
        "text over the character bound, truncated",
        "truncation",
        _req(prompt="x" * 40000, truncate_prompt_tokens=10, max_tokens=3),
    )
    add("max_tokens over the context", "errors", _req(prompt=TEXT, max_tokens=5000))
    add("max_tokens 0 without echo", "errors", _req(prompt=TEXT, max_tokens=0))
    add("max_tokens -1", "errors", _req(prompt=TEXT, max_tokens=-1))
    add("greedy n=2", "errors", _req(prompt=TEXT, n=2))
    add("n=0", "errors", _req(prompt=TEXT, n=0, temperature=1.0))
    add("temperature 3", "errors", _req(prompt=TEXT, temperature=3))
    add("top_p 0", "errors", _req(prompt=TEXT, top_p=0, temperature=1.0))
    add("suffix", "errors", _req(prompt=TEXT, suffix="x"))
    add("stream_options without stream", "errors", _req(prompt=TEXT, stream_options={"include_usage": True}))
    add(
        "stream_options with stream false",
        "errors",
        _req(prompt=TEXT, stream=False, stream_options={"include_usage": True}),
    )
    add(
        "stream_options include_usage null with stream false",
        "errors",
        _req(prompt=TEXT, stream=False, stream_options={"include_usage": None}),
    )
    add(
        "stream_options continuous_usage_stats null without stream",
        "errors",
        _req(prompt=TEXT, stream=_DROP, stream_options={"continuous_usage_stats": None}),
    )
    add("stream_options {} with stream false", "stream", _req(prompt=TEXT, stream=False, stream_options={}))
    # -- kv_transfer_params: passed to the engine (no KV connector here: it is ignored, as in vLLM)
    add(
        "kv_transfer_params with prompt_token_ids",
        "kv",
        _req(prompt=TEXT, kv_transfer_params={"prompt_token_ids": IDS}),
    )
    add(
        "kv_transfer_params remote prefill, streamed",
        "kv",
        _req(
            prompt=TEXT,
            stream=True,
            stream_options={"include_usage": True},
            kv_transfer_params={"do_remote_prefill": False, "do_remote_decode": True, "remote_engine_id": None},
        ),
    )
    add("kv_transfer_params empty", "kv", _req(prompt=IDS, kv_transfer_params={}))
    add("kv_transfer_params not an object", "kv", _req(prompt=TEXT, kv_transfer_params=["x"]))
    # -- /load (both servers run with --enable-server-load-tracking; a request in flight:
    # tests/parity/test_load_parity.py)
    add("GET /load while idle", "load", None, path="/load", method="GET")
    add("prompt_logprobs with stream", "errors", _req(prompt=TEXT, prompt_logprobs=1, stream=True))
    add("logprobs over the maximum", "errors", _req(prompt=TEXT, logprobs=30))
    add(
        "logprobs over the maximum, streamed",
        "errors",
        _req(prompt=TEXT, logprobs=30, stream=True),
        deviation="eager_validation",
    )
    add("stop holds an empty string", "errors", _req(prompt=TEXT, stop=["a", ""]))
    add("1025 prompts", "errors", _req(prompt=["x"] * 1025))
    add("n is a string", "errors", _req(prompt=TEXT, n="two"))
    add("max_tokens is a numeric string", "errors", _req(prompt=TEXT, max_tokens="5"), deviation="strict_types")
    add("n is the float 1.0", "errors", _req(prompt=TEXT, n=1.0), deviation="strict_types")
    add("beam search", "errors", _req(prompt=TEXT, n=2, use_beam_search=True), deviation="unsupported_fields")
    # taken by both (vLLM's FCFS scheduler ignores it; braid's admission orders by it)
    add("priority 1", "errors", _req(prompt=TEXT, priority=1))
    add("priority -2, streamed", "errors", _req(prompt=TEXT, priority=-2, stream=True))
    add("unknown model", "errors", _req(prompt=TEXT, model="no-such-model"))
    add("bad JSON", "errors", b'{"model": "braid-tiny", "prompt": "x",')
    add("body is a JSON array", "errors", b"[1, 2]")
    add("wrong content type", "errors", b'{"model": "braid-tiny", "prompt": "x"}', content_type="text/plain")
    _server_option_cases(add)
    return c


CHAT_BODY: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Hi"}],
    "max_tokens": 8,
    "temperature": 0,
}
LOAD_NAMES = ("endpoint-load-metrics",)
ASK_TEXT = (("endpoint-load-metrics-format", "text"),)


def _server_option_cases(add: Any) -> None:
    """Issue 29's routes and options. Both shared servers run tools/servers.py ROUTE_FLAGS
    (``--enable-tokenizer-info-endpoint``, ``--enable-request-id-headers``)."""
    group = "server options"
    add("GET /tokenizer_info", group, None, path="/tokenizer_info", method="GET", deviation="tokenizer_pool_class")
    add("GET /version", group, None, path="/version", method="GET", deviation="version_braid_version")
    # /invocations (SageMaker): placed on chat, else completions, by the body's shape
    add("invocations, a chat body", group, CHAT_BODY, path="/invocations")
    add("invocations, a chat body streamed", group, {**CHAT_BODY, "stream": True}, path="/invocations")
    add("invocations, a completions body", group, _req(prompt=[TEXT, TEXT2], logprobs=1), path="/invocations")
    add(
        "invocations, a completions body streamed",
        group,
        _req(prompt=TEXT, stream=True, stream_options={"include_usage": True}),
        path="/invocations",
    )
    # completions' schema takes any object (prompt is optional there): its handler refuses it
    add("invocations, neither messages nor prompt", group, {"model": MODEL, "max_tokens": 3}, path="/invocations")
    add(
        "invocations, fields of the wrong type for both",
        group,
        {"messages": "hi", "prompt": "x", "n": "two"},
        path="/invocations",
    )
    add(
        "invocations, batched chat is neither",
        group,
        {**CHAT_BODY, "messages": [CHAT_BODY["messages"]]},
        path="/invocations",
    )
    add("invocations, a chat body chat refuses", group, {**CHAT_BODY, "top_logprobs": 2}, path="/invocations")
    # the body's model is replaced by SageMaker's adapter header (null without it)
    add(
        "invocations, the body's model is not read",
        group,
        _req(prompt=TEXT, model="no-such-model"),
        path="/invocations",
    )
    add(
        "invocations, the adapter header names an unknown model",
        group,
        CHAT_BODY,
        path="/invocations",
        headers=(("X-Amzn-SageMaker-Adapter-Identifier", "no-such-adapter"),),
    )
    add("invocations, bad JSON", group, b'{"prompt": "x",', path="/invocations")
    add("invocations, wrong content type", group, b'{"prompt": "x"}', path="/invocations", content_type="text/plain")
    # X-Request-Id (--enable-request-id-headers): the client's, on any answer
    rid = ("x-request-id",)
    client_id = (("X-Request-Id", "parity-request-7"),)
    add("X-Request-Id: the client's, completions", group, _req(prompt=TEXT), headers=client_id, response_headers=rid)
    add(
        "X-Request-Id: the client's, chat streamed",
        group,
        {**CHAT_BODY, "stream": True},
        path="/v1/chat/completions",
        headers=client_id,
        response_headers=rid,
    )
    add("X-Request-Id: the client's, on an error", group, _req(prompt=[]), headers=client_id, response_headers=rid)
    add(
        "X-Request-Id: made by the server, GET /health", group, None, path="/health", method="GET", response_headers=rid
    )
    add(
        "X-Request-Id: made by the server, GET /load",
        group,
        None,
        path="/load",
        method="GET",
        response_headers=rid,
    )
    add(
        "X-Request-Id: made by the server, completions",
        group,
        _req(prompt=TEXT),
        response_headers=rid,
        deviation="request_id_names_the_response",
    )
    # the ORCA load report (endpoint-load-metrics-format): whole answers of completions and chat
    add("ORCA load report, text, completions", group, _req(prompt=TEXT), headers=ASK_TEXT, response_headers=LOAD_NAMES)
    add(
        "ORCA load report, json, chat",
        group,
        CHAT_BODY,
        path="/v1/chat/completions",
        headers=(("endpoint-load-metrics-format", "JSON"),),
        response_headers=LOAD_NAMES,
    )
    add(
        "ORCA load report, text, invocations",
        group,
        CHAT_BODY,
        path="/invocations",
        headers=ASK_TEXT,
        response_headers=LOAD_NAMES,
    )
    add(
        "ORCA load report: none on a stream",
        group,
        _req(prompt=TEXT, stream=True),
        headers=ASK_TEXT,
        response_headers=LOAD_NAMES,
    )
    add(
        "ORCA load report: none for an unknown format",
        group,
        _req(prompt=TEXT),
        headers=(("endpoint-load-metrics-format", "yaml"),),
        response_headers=LOAD_NAMES,
    )
    add(
        "ORCA load report: none on an error",
        group,
        _req(prompt=[]),
        headers=ASK_TEXT,
        response_headers=LOAD_NAMES,
    )
    add(
        "ORCA load report: none on batched chat",
        group,
        {**CHAT_BODY, "messages": [CHAT_BODY["messages"]]},
        path="/v1/chat/completions/batch",
        headers=ASK_TEXT,
        response_headers=LOAD_NAMES,
        deviation="batch_chat_reasoning_tokens",
    )


def _all_cases() -> tuple[Case, ...]:
    from tests.parity.chat_matrix import chat_cases  # it builds on Case and the constants above

    return tuple(_cases() + chat_cases())


MATRIX: tuple[Case, ...] = _all_cases()
