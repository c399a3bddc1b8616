"""Structured output on the real engine (the tiny model, vLLM's xgrammar backend): the text
follows the constraint, and a constraint vLLM cannot compile is a 400 before any stream."""

from __future__ import annotations

import json
import re
import types
from typing import Any

import httpx
import pytest

from braid.engine.base import SamplingParams
from braid.engine.vllm import VllmEngine
from braid.engine.vllm_common import CPU_ENGINE_ARGS, is_cpu_build, prepare_environment
from braid.engine.vllm_core import VllmCoreEngine
from braid.errors import InvalidRequest
from braid.models.tiny import default_dir
from braid.wire.structured import Structured
from tests.helpers import VllmServer, no_whitespace, parse_sse

pytestmark = pytest.mark.vllm

CHOICES = ["red", "green", "blue"]
COLOUR = {
    "type": "object",
    "properties": {"colour": {"enum": CHOICES}},
    "required": ["colour"],
    "additionalProperties": False,
}


def complete(server: VllmServer, **fields: Any) -> httpx.Response:
    body = {"model": server.model, "prompt": "def colour():", "max_tokens": 16, **fields}
    return httpx.post(server.url + "/v1/completions", json=body, timeout=120)


def texts(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    return [c["text"] for c in r.json()["choices"]]


def test_choice(vllm_server: VllmServer) -> None:
    r = complete(vllm_server, n=4, seed=1, structured_outputs={"choice": CHOICES})
    assert all(t in CHOICES for t in texts(r))
    assert all(c["finish_reason"] == "stop" for c in r.json()["choices"])


def test_regex(vllm_server: VllmServer) -> None:
    r = complete(vllm_server, prompt=["x = ", "y = "], n=2, seed=2, structured_outputs={"regex": "[a-c]{3}"})
    assert all(re.fullmatch("[a-c]{3}", t) for t in texts(r))


def test_the_deprecated_guided_regex(vllm_server: VllmServer) -> None:
    assert all(re.fullmatch("[a-c]{3}", t) for t in texts(complete(vllm_server, seed=3, guided_regex="[a-c]{3}")))


def test_json_schema_by_response_format(vllm_server: VllmServer) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "colour", "schema": COLOUR, "strict": True}}
    # Without the whitespace ban the tiny model may fill the grammar's optional whitespace until
    # max_tokens, for a seed that closed the object on the machine the test was written on.
    r = complete(vllm_server, n=2, seed=4, max_tokens=200, response_format=rf, logit_bias=no_whitespace())
    for text in texts(r):
        assert json.loads(text) in [{"colour": c} for c in CHOICES]


def test_json_schema_by_structured_outputs_without_whitespace(vllm_server: VllmServer) -> None:
    so = {"json": COLOUR, "disable_any_whitespace": True}
    for text in texts(complete(vllm_server, seed=5, max_tokens=40, structured_outputs=so)):
        assert json.loads(text) in [{"colour": c} for c in CHOICES]


def test_a_grammar(vllm_server: VllmServer) -> None:
    grammar = 'root ::= "yes" | "no"'
    assert texts(complete(vllm_server, seed=6, structured_outputs={"grammar": grammar}))[0] in {"yes", "no"}


def test_streaming(vllm_server: VllmServer) -> None:
    body = {
        "model": vllm_server.model,
        "prompt": ["a", "b"],
        "max_tokens": 16,
        "seed": 7,
        "stream": True,
        "structured_outputs": {"regex": "[a-c]{3}"},
    }
    with httpx.stream("POST", vllm_server.url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        events = parse_sse(r.read())
    assert events[-1] == "[DONE]"
    for index in (0, 1):
        parts = [
            e["choices"][0]
            for e in events
            if isinstance(e, dict) and e["choices"] and e["choices"][0]["index"] == index
        ]
        assert re.fullmatch("[a-c]{3}", "".join(p["text"] for p in parts))
        assert parts[-1]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs", "regex"),
        ({"structured_outputs": {"regex": "(?<=a)b"}}, "structured_outputs", "look-around"),
        ({"structured_outputs": {"json": {"type": "foo"}}}, "structured_outputs", "foo"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}}},
            "response_format",
            "nope",
        ),
        ({"guided_grammar": "root ::= nope"}, "guided_grammar", "nope"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs", "empty list"),  # braid's own check
    ],
    ids=repr,
)
def test_an_uncompilable_constraint_is_a_400_before_any_stream(
    vllm_server: VllmServer, fields: dict, param: str, message: str
) -> None:
    for stream in (True, False):
        r = complete(vllm_server, stream=stream, **fields)
        assert r.status_code == 400, r.text
        assert r.headers["content-type"].startswith("application/json")
        error = r.json()["error"]
        assert (error["param"], error["code"], error["type"]) == (param, 400, "BadRequestError")
        assert message in error["message"]


# --- both clients' check, in this process: vLLM's input processor, no engine ------------------------


@pytest.fixture(scope="module")
def input_processor(vllm_server: VllmServer) -> Any:
    """vLLM's input processor for the tier's model (built by the server fixture), as the engine
    clients hold it: building it starts no engine."""
    prepare_environment(cpu=is_cpu_build())
    from vllm import AsyncEngineArgs
    from vllm.renderers import renderer_from_config
    from vllm.v1.engine.input_processor import InputProcessor

    config = AsyncEngineArgs(model=str(default_dir()), max_model_len=1024, **CPU_ENGINE_ARGS).create_engine_config()
    return InputProcessor(config, renderer_from_config(config))


def engines(input_processor: Any) -> list[Any]:
    """Each client's engine, holding only what its check reads."""
    from vllm import SamplingParams as VllmParams

    core = VllmCoreEngine(None, input_processor, None, (), None, None, None, VllmParams, None, None)  # type: ignore[arg-type]
    llm = types.SimpleNamespace(input_processor=input_processor)
    return [core, VllmEngine(None, llm, None, None, None, VllmParams)]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "structured",
    [
        Structured(json=json.dumps(COLOUR)),
        Structured(regex="[a-c]{3}"),
        Structured(choice=("a", "b")),
        Structured(grammar='root ::= "a"'),
        Structured(json_object=True),
    ],
    ids=lambda s: s.kind,
)
def test_both_clients_pass_what_compiles(input_processor: Any, structured: Structured) -> None:
    for engine in engines(input_processor):
        engine.check_structured(SamplingParams(max_tokens=4, structured_outputs=structured))
        engine.check_structured(SamplingParams(max_tokens=4))  # no constraint: nothing to check


def test_both_clients_refuse_what_does_not_compile(input_processor: Any) -> None:
    bad = SamplingParams(max_tokens=4, structured_outputs=Structured(regex="[a-", source="guided_regex"))
    for engine in engines(input_processor):
        with pytest.raises(InvalidRequest) as info:
            engine.check_structured(bad)
        assert info.value.param == "guided_regex" and info.value.message.startswith("guided_regex: ")
