"""``braid serve``'s options: each default is the one its config class declares, each value
reaches its field, and each variable keeps its flag's name (braid.cli.fields, braid.cli.config)."""

from __future__ import annotations

import argparse
from typing import Any

import attrs
import pytest

from braid.cli.argtypes import json_object, lora_module
from braid.cli.config import engine_options_from, server_config_from, settings_from, store_options_from
from braid.cli.engines import TINY_MODEL_ENGINE_ARGS, EngineOptions
from braid.cli.environ import env_name
from braid.cli.fields import add_field_option, field_default
from braid.cli.parser import build_parser
from braid.http.server import ServerConfig
from braid.settings import ParserOptions, ServingOptions, Settings
from braid.store.options import StoreOptions, default_storage_dir

OWNERS: tuple[type[Any], ...] = (Settings, ServerConfig, EngineOptions, ParserOptions, ServingOptions, StoreOptions)

EXPOSED = {
    Settings: {
        "max_prompts",
        "max_choices",
        "max_body_bytes",
        "body_timeout",
        "max_header_bytes",
        "stall_timeout",
        "heartbeat",
        "max_in_flight",
        "max_queued",
        "reserve",
        "background_slots",
        "handover_tokens",
        "request_timeout",
        "prompt_tokens_details",
        "metrics_public",
        "trust_request_chat_template",
        "allowed_origins",
        "access_log",
        "forwarded_allow_ips",
        "server_load_tracking",
        "runtime_lora_updating",
    },
    ServerConfig: {
        "host",
        "port",
        "graceful_timeout",
        "keep_alive_timeout",
        "write_timeout",
        "backlog",
        "accept_batch",
    },
    EngineOptions: {field.name for field in attrs.fields(EngineOptions)},
    ParserOptions: {field.name for field in attrs.fields(ParserOptions)},
    ServingOptions: {field.name for field in attrs.fields(ServingOptions)},
    StoreOptions: {field.name for field in attrs.fields(StoreOptions)},
}
"""The fields with an option of their own, stored under the field's name. Settings.api_keys is
made from three sources (braid.cli.config.api_keys), ServerConfig.fast_send from --stock-send."""

# (argv, owner, field, value): a value other than the default for every exposed field.
GIVEN: list[tuple[list[str], type[Any], str, Any]] = [
    (["--max-prompts", "3"], Settings, "max_prompts", 3),
    (["--max-choices", "5"], Settings, "max_choices", 5),
    (["--max-body-bytes", "999"], Settings, "max_body_bytes", 999),
    (["--body-timeout", "2.5"], Settings, "body_timeout", 2.5),
    (["--max-header-bytes", "4096"], Settings, "max_header_bytes", 4096),
    (["--stall-timeout", "7"], Settings, "stall_timeout", 7.0),
    (["--heartbeat", "3"], Settings, "heartbeat", 3.0),
    (["--max-in-flight-requests", "8"], Settings, "max_in_flight", 8),
    (["--max-queued-requests", "9"], Settings, "max_queued", 9),
    (["--admission-reserve", "2"], Settings, "reserve", 2),
    (["--batch-max-slots", "5"], Settings, "background_slots", 5),
    (["--handover-tokens", "0"], Settings, "handover_tokens", 0),
    (["--request-timeout", "60"], Settings, "request_timeout", 60.0),
    (["--enable-prompt-tokens-details"], Settings, "prompt_tokens_details", True),
    (["--metrics-public"], Settings, "metrics_public", True),
    (["--trust-request-chat-template"], Settings, "trust_request_chat_template", True),
    (
        ["--allowed-origins", "https://a.example", "--allowed-origins", "*"],
        Settings,
        "allowed_origins",
        ("https://a.example", "*"),
    ),
    (["--access-log"], Settings, "access_log", True),
    (["--enable-server-load-tracking"], Settings, "server_load_tracking", True),
    (["--forwarded-allow-ips", "10.1.2.3/8,::1"], Settings, "forwarded_allow_ips", ("10.0.0.0/8", "::1")),
    (["--host", "0.0.0.0"], ServerConfig, "host", "0.0.0.0"),
    (["--port", "9001"], ServerConfig, "port", 9001),
    (["--graceful-timeout", "4"], ServerConfig, "graceful_timeout", 4.0),
    (["--keep-alive", "12"], ServerConfig, "keep_alive_timeout", 12.0),
    (["--write-timeout", "11"], ServerConfig, "write_timeout", 11.0),
    (["--backlog", "77"], ServerConfig, "backlog", 77),
    (["--accept-batch", "6"], ServerConfig, "accept_batch", 6),
    (["--engine", "vllm"], EngineOptions, "engine", "vllm"),
    (["--token-delay", "0.25"], EngineOptions, "token_delay", 0.25),
    (["--model", "/models/m"], EngineOptions, "model", "/models/m"),
    (["--served-model-name", "m"], EngineOptions, "served_model_name", "m"),
    (["--dtype", "float16"], EngineOptions, "dtype", "float16"),
    (["--max-model-len", "512"], EngineOptions, "max_model_len", 512),
    (["--max-num-seqs", "32"], EngineOptions, "max_num_seqs", 32),
    (["--tensor-parallel-size", "2"], EngineOptions, "tensor_parallel_size", 2),
    (["--distributed-executor-backend", "mp"], EngineOptions, "distributed_executor_backend", "mp"),
    (["--seed", "5"], EngineOptions, "seed", 5),
    (["--scheduling-policy", "priority"], EngineOptions, "scheduling_policy", "priority"),
    (
        ["--engine-arg", "enforce_eager=true", "--engine-arg", "x=y"],
        EngineOptions,
        "engine_args",
        (("enforce_eager", True), ("x", "y")),
    ),
    (["--engine-client", "asyncio"], EngineOptions, "engine_client", "asyncio"),
    (["--fault-hooks"], EngineOptions, "fault_hooks", True),
    (["--enable-lora"], EngineOptions, "enable_lora", True),
    (["--max-loras", "3"], EngineOptions, "max_loras", 3),
    (["--max-lora-rank", "32"], EngineOptions, "max_lora_rank", 32),
    (["--max-cpu-loras", "4"], EngineOptions, "max_cpu_loras", 4),
    (["--allow-runtime-lora-updating"], Settings, "runtime_lora_updating", True),
    (
        ["--lora-modules", "a=/p/a", '{"name": "b", "path": "/p/b"}', "--lora-modules", "c=/p/c=d"],
        EngineOptions,
        "lora_modules",
        (("a", "/p/a"), ("b", "/p/b"), ("c", "/p/c=d")),
    ),
    (
        ["--kv-events-config", '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}'],
        EngineOptions,
        "kv_events_config",
        {"enable_kv_cache_events": True, "endpoint": "tcp://*:5557"},
    ),
    (["--switch-interval", "0.002"], EngineOptions, "switch_interval", 0.002),
    (["--enable-auto-tool-choice"], ParserOptions, "enable_auto_tool_choice", True),
    (["--tool-call-parser", "hermes"], ParserOptions, "tool_call_parser", "hermes"),
    (["--tool-parser-plugin", "/p.py"], ParserOptions, "tool_parser_plugin", "/p.py"),
    (["--reasoning-parser", "qwen3"], ParserOptions, "reasoning_parser", "qwen3"),
    (["--exclude-tools-when-tool-choice-none"], ParserOptions, "exclude_tools_when_tool_choice_none", True),
    (["--enable-tokenizer-info-endpoint"], ServingOptions, "tokenizer_info_endpoint", True),
    (["--enable-force-include-usage"], ServingOptions, "force_include_usage", True),
    (["--return-tokens-as-token-ids"], ServingOptions, "return_tokens_as_token_ids", True),
    (["--enable-request-id-headers"], ServingOptions, "request_id_headers", True),
    (["--storage-dir", "/srv/braid"], StoreOptions, "storage_dir", "/srv/braid"),
    (["--store", "postgresql://braid@db/braid"], StoreOptions, "database", "postgresql://braid@db/braid"),
    (["--max-file-bytes", "1000"], StoreOptions, "max_file_bytes", 1000),
    (["--max-storage-bytes", "5000"], StoreOptions, "max_storage_bytes", 5000),
    (["--file-retention", "7200"], StoreOptions, "file_retention", 7200),
    (["--batch-completion-window", "60"], StoreOptions, "batch_window", 60),
    (["--batch-max-lines", "10"], StoreOptions, "max_batch_lines", 10),
    (["--batch-group-lines", "1"], StoreOptions, "batch_group_lines", 1),
    (["--store-shared", "--store", "postgresql://braid@db/braid"], StoreOptions, "shared", True),
    (["--batch-chunk-lines", "64"], StoreOptions, "batch_chunk_lines", 64),
    (["--batch-lease", "10"], StoreOptions, "batch_lease", 10),
    (["--response-retention", "60"], StoreOptions, "response_retention", 60),
    (["--max-response-bytes", "4096"], StoreOptions, "max_response_bytes", 4096),
]


def _serve_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in commands.choices["serve"]._actions if a.option_strings]


def test_each_option_s_default_is_its_class_s() -> None:
    """No default is restated: an option filling a field starts from the field's default (a
    repeatable one from it as a list); only --write-timeout's is its own, 'the stall timeout'."""
    options = _serve_options(build_parser())
    for owner in OWNERS:
        fields = attrs.fields_dict(owner)
        exposed = {a.dest: a for a in options if a.dest in fields}
        assert set(exposed) == EXPOSED[owner], owner
        for name, action in exposed.items():
            if (owner, name) in ((ServerConfig, "write_timeout"), (StoreOptions, "storage_dir")):
                # the stall timeout given; the user's data directory (braid.cli.config)
                assert action.default is None
                continue
            default = tuple(action.default) if isinstance(action.default, list) else action.default
            assert default == fields[name].default, f"{owner.__name__}.{name}"


def test_with_no_flags_each_class_is_its_default() -> None:
    args = build_parser().parse_args(["serve"])
    assert settings_from(args, {}) == Settings()
    assert server_config_from(args) == ServerConfig()
    assert engine_options_from(args) == EngineOptions()
    assert store_options_from(args) == StoreOptions(storage_dir=default_storage_dir())


def test_every_option_reaches_its_field() -> None:
    argv = [arg for given, *_ in GIVEN for arg in given]
    args = build_parser().parse_args(["serve", *argv])
    built: dict[type[Any], Any] = {
        Settings: settings_from(args, {}),
        ServerConfig: server_config_from(args),
        EngineOptions: engine_options_from(args),
        StoreOptions: store_options_from(args),
    }
    built[ParserOptions] = built[Settings].parsers
    built[ServingOptions] = built[Settings].serving
    for given, owner, name, value in GIVEN:
        assert getattr(built[owner], name) == value, given
    covered = {(owner, name) for _, owner, name, _ in GIVEN}
    assert covered | {(EngineOptions, "reserve")} == {(o, n) for o in OWNERS for n in EXPOSED[o]}
    assert built[EngineOptions].reserve == built[Settings].reserve == 2
    assert server_config_from(build_parser().parse_args(["serve", "--stock-send"])).fast_send is False


def test_each_variable_is_named_for_its_flag_not_its_field() -> None:
    env = {
        "BRAID_MAX_IN_FLIGHT_REQUESTS": "4",
        "BRAID_ADMISSION_RESERVE": "3",
        "BRAID_ENABLE_PROMPT_TOKENS_DETAILS": "on",
        "BRAID_KEEP_ALIVE": "5",
        "BRAID_ENGINE_ARG": "a=1 b=x",
        "BRAID_SWITCH_INTERVAL": "0.002",
    }
    args = build_parser(env).parse_args(["serve"])
    settings, cfg, engine = settings_from(args, {}), server_config_from(args), engine_options_from(args)
    assert (settings.max_in_flight, settings.reserve, settings.prompt_tokens_details) == (4, 3, True)
    assert cfg.keep_alive_timeout == 5.0
    assert engine.engine_args == (("a", 1), ("b", "x")) and engine.switch_interval == 0.002
    names = {env_name(a) for a in _serve_options(build_parser())}
    assert set(env) <= names


def test_help_shows_every_option_s_default_and_variable(capsys: pytest.CaptureFixture[str]) -> None:
    for action in _serve_options(build_parser()):
        if action.dest in ("help", "api_key"):
            continue
        assert action.help is not None and action.help.endswith(f"; env {env_name(action)})"), action.dest
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for shown in (
        "--keep-alive KEEP_ALIVE",  # the metavar stays the flag's, whatever field it fills
        "(default: 75.0; env BRAID_KEEP_ALIVE)",
        "(default: 2048; env BRAID_BACKLOG)",
        "(default: 127.0.0.1; env BRAID_HOST)",
        "(default: 33554432; env BRAID_MAX_BODY_BYTES)",
        "(default: auto; env BRAID_ENGINE)",
        "(default: none; env BRAID_ENGINE_ARG)",
        "(default: none; env BRAID_WRITE_TIMEOUT)",
        "(default: off; env BRAID_ENABLE_PROMPT_TOKENS_DETAILS)",
    ):
        assert shown in out


def test_a_value_a_config_class_refuses_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import braid.cli.main

    monkeypatch.setattr(braid.cli.main, "open_engine", None)  # never reached
    for argv in (["--backlog", "0"], ["--max-prompts", "0"]):
        with pytest.raises(SystemExit) as exit_:
            braid.cli.main.main(["serve", "--engine", "scripted", "--port", "0", *argv])
        assert exit_.value.code == 2
        assert "Traceback" not in capsys.readouterr().err


def test_the_vllm_arguments() -> None:
    """The tiny model's sizing for the default model, then the fields given, then --engine-arg."""
    assert EngineOptions().vllm_kwargs() == TINY_MODEL_ENGINE_ARGS
    given = EngineOptions(max_num_seqs=8, seed=1, engine_args=[("max_num_seqs", 4), ("enforce_eager", True)])
    assert given.vllm_kwargs() == {**TINY_MODEL_ENGINE_ARGS, "max_num_seqs": 4, "seed": 1, "enforce_eager": True}
    assert EngineOptions(model="m", dtype="half").vllm_kwargs() == {"dtype": "half"}


def test_the_lora_options_are_vllm_engine_arguments() -> None:
    given = EngineOptions(enable_lora=True, max_loras=2, max_lora_rank=8, lora_modules=[("a", "/p/a")])
    assert given.vllm_kwargs() == {**TINY_MODEL_ENGINE_ARGS, "enable_lora": True, "max_loras": 2, "max_lora_rank": 8}
    assert given.lora_modules == (("a", "/p/a"),)  # braid loads them itself (braid.engine.vllm)


@pytest.mark.parametrize(
    ("text", "module"),
    [
        ("a=/p/a", ("a", "/p/a")),
        ('{"name": "a", "path": "/p/a"}', ("a", "/p/a")),
        ('{"name": "a", "path": "/p/a", "base_model_name": "m"}', ("a", "/p/a")),
        ('{"name":"a=b"}', ('{"name":"a', 'b"}')),  # vLLM's rule: "=" and no ",", NAME=PATH
    ],
)
def test_a_lora_module_in_vllms_forms(text: str, module: tuple[str, str]) -> None:
    assert lora_module(text) == module


@pytest.mark.parametrize(
    "text",
    [
        "a",
        "=/p",
        "a=",
        "{",
        '["a", "/p"]',
        '{"name": "a"}',
        '{"name": "a", "path": "/p", "rank": 8}',
        '{"name": 1, "path": "/p"}',
    ],
)
def test_a_lora_module_that_is_neither_form_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        lora_module(text)


def test_an_option_needs_a_plain_default() -> None:
    @attrs.frozen
    class Owner:
        items: list[str] = attrs.Factory(list)
        required: int = attrs.field(kw_only=True)

    parser = argparse.ArgumentParser()
    for name in ("items", "required"):
        with pytest.raises(TypeError):
            add_field_option(parser, Owner, name, "--" + name)
    assert field_default(Settings, "max_queued") == 256


def test_kv_events_config_is_the_engine_s_and_a_json_object() -> None:
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557"}
    assert EngineOptions(model="m", kv_events_config=config).vllm_kwargs() == {"kv_events_config": config}
    for text in ("[1]", "tcp://*:5557", '"x"'):
        with pytest.raises(argparse.ArgumentTypeError, match="expected a JSON object"):
            json_object(text)


@pytest.mark.parametrize(
    ("value", "allowed"), [("1", True), ("TRUE", True), (" true ", True), ("0", False), ("yes", False)]
)
def test_vllms_variable_allows_runtime_lora_updating_as_vllm_reads_it(value: str, allowed: bool) -> None:
    args = build_parser().parse_args(["serve"])
    assert settings_from(args, {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": value}).runtime_lora_updating is allowed
