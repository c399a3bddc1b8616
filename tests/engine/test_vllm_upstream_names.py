"""Every private vLLM name braid's engine code relies on exists in the installed vLLM.

braid drives vLLM's internals (src/braid/engine/vllm_core.py: the engine-core client, the output
processor, the wire messages; vllm_stats.py: the stat logger; vllm_parsers.py: the parser
manager; core_process.py: the engine core's entry point). They change between releases, so
pyproject.toml pins the vLLM the tests run (braid.engine.vllm_common.VLLM_VERSION). When a new
vLLM is tried (README, "Moving to a newer vLLM"), this test names each name that moved and the
braid module that relies on it, before the real-engine tier fails on a request.

Three kinds of name: a module attribute path (``Cls.method``), an attribute set on instances
(``self.NAME = ...`` in a class's ``__init__``, or a dataclass or msgspec field), and the keyword
parameters braid passes to a callable.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import attrs
import pytest

pytestmark = pytest.mark.vllm


@attrs.frozen
class Name:
    module: str
    path: str
    """Attributes from the module, dotted; "" for the module itself."""
    used_by: str
    instance: tuple[str, ...] = ()
    """Attributes instances of ``path`` (a class) carry, not the class."""
    keywords: tuple[str, ...] = ()
    """Keyword parameters braid passes to ``path`` (a callable)."""

    def __str__(self) -> str:
        return f"{self.module}{':' + self.path if self.path else ''}"


CORE = "braid.engine.vllm_core"
NAMES = (
    # the engine-core client braid subclasses and drives from the Trio thread
    Name(
        "vllm.v1.engine.core_client",
        "MPClient",
        CORE,
        instance=("input_socket", "core_engine", "encoder", "decoder", "resources"),
        keywords=("asyncio_mode", "vllm_config", "executor_class", "log_stats", "renderer"),
    ),
    Name("vllm.v1.engine.core_client", "MPClient.start_engine_core_monitor", CORE),
    Name("vllm.v1.engine.core_client", "MPClient.shutdown", CORE),
    Name(
        "vllm.v1.engine.core_client",
        "BackgroundResources",
        CORE,
        instance=("output_socket", "engine_manager", "engine_dead"),
    ),
    Name("vllm.v1.engine.core_client", "BackgroundResources.validate_alive", CORE),
    Name("vllm.v1.engine.utils", "CoreEngineProcManager", CORE, instance=("processes",)),
    Name("vllm.v1.engine.exceptions", "EngineDeadError", "braid.engine.vllm_common"),
    Name("vllm.v1.engine", "EngineCoreRequestType.ADD", CORE),
    Name("vllm.v1.engine", "EngineCoreRequestType.ABORT", CORE),
    Name("vllm.v1.engine", "EngineCoreRequestType.UTILITY", CORE),
    Name(
        "vllm.v1.engine",
        "EngineCoreRequest",
        CORE,
        instance=("request_id", "sampling_params", "client_index", "reasoning_ended", "reasoning_parser_kwargs"),
    ),
    Name("vllm.v1.engine", "EngineCoreRequest.params", CORE),
    Name(
        "vllm.v1.engine",
        "EngineCoreOutputs",
        CORE,
        instance=("utility_output", "outputs", "timestamp", "scheduler_stats"),
    ),
    Name("vllm.v1.engine", "EngineCoreOutput", CORE, instance=("request_id", "new_token_ids")),
    Name("vllm.v1.engine", "UtilityOutput", CORE, instance=("call_id", "failure_message", "result")),
    Name("vllm.v1.engine.core", "EngineCore.get_supported_tasks", CORE),
    Name("vllm.v1.engine.core", "EngineCore.add_lora", CORE),
    Name("vllm.v1.engine.core", "EngineCoreProc.run_engine_core", "braid.engine.core_process"),
    Name("vllm.v1.engine.input_processor", "InputProcessor", CORE, instance=("lora_config", "model_config")),
    Name(
        "vllm.v1.engine.input_processor",
        "InputProcessor.process_inputs",
        CORE,
        keywords=("supported_tasks", "arrival_time", "lora_request", "priority"),
    ),
    Name("vllm.v1.engine.input_processor", "InputProcessor.assign_request_id", CORE),
    Name(
        "vllm.v1.engine.output_processor",
        "OutputProcessor",
        CORE,
        instance=("request_states",),
        keywords=("log_stats", "stream_interval"),
    ),
    Name("vllm.v1.engine.output_processor", "OutputProcessor.add_request", CORE),
    Name("vllm.v1.engine.output_processor", "OutputProcessor.process_outputs", CORE),
    Name("vllm.v1.engine.output_processor", "OutputProcessor.abort_requests", CORE, keywords=("internal",)),
    Name("vllm.v1.engine.output_processor", "OutputProcessor.update_scheduler_stats", CORE),
    Name("vllm.v1.engine.output_processor", "OutputProcessor.get_num_unfinished_requests", CORE),
    Name("vllm.v1.engine.output_processor", "OutputProcessorOutput", CORE, instance=("reqs_to_abort",)),
    Name("vllm.v1.engine.output_processor", "RequestState", CORE, instance=("queue",)),
    Name("vllm.v1.engine.parallel_sampling", "ParentRequest.get_child_info", CORE),
    Name("vllm.v1.executor", "Executor.get_class", CORE),
    Name("vllm.v1.serial_utils", "UtilityResult", CORE, instance=("result",)),
    Name("vllm.outputs", "RequestOutput.add", CORE, keywords=("aggregate",)),
    Name("vllm.renderers", "renderer_from_config", CORE),
    Name("vllm.transformers_utils.config", "maybe_register_config_serialize_by_value", CORE),
    # sampling parameters and outputs (both clients)
    Name(
        "vllm.sampling_params",
        "SamplingParams",
        "braid.engine.vllm_common",
        keywords=("output_kind", "skip_clone", "extra_args", "structured_outputs", "stream_interval"),
    ),
    Name("vllm.sampling_params", "SamplingParams.verify", "braid.engine.vllm_common"),
    Name("vllm.sampling_params", "RequestOutputKind.DELTA", "braid.engine.vllm_common"),
    Name("vllm.sampling_params", "RequestOutputKind.FINAL_ONLY", "braid.engine.vllm_common"),
    Name("vllm.sampling_params", "StructuredOutputsParams", "braid.engine.vllm_common"),
    Name("vllm.lora.request", "LoRARequest", "braid.engine.vllm_common", keywords=("load_inplace",)),
    Name("vllm.exceptions", "VLLMValidationError", "braid.engine.vllm_common"),
    Name("vllm.tokenizers", "get_tokenizer", "braid.engine.vllm_common", keywords=("trust_remote_code",)),
    # the asyncio client
    Name("vllm.v1.engine.async_llm", "AsyncLLM.from_engine_args", "braid.engine.vllm"),
    Name(
        "vllm.v1.engine.async_llm",
        "AsyncLLM.generate",
        "braid.engine.vllm",
        keywords=("lora_request", "priority", "reasoning_ended", "reasoning_parser_kwargs"),
    ),
    Name("vllm.v1.engine.async_llm", "AsyncLLM", "braid.engine.vllm", instance=("logger_manager", "input_processor")),
    # vLLM's statistics
    Name("vllm.v1.metrics.prometheus", "get_prometheus_registry", "braid.engine.vllm_stats"),
    Name(
        "vllm.v1.metrics.loggers",
        "PrometheusStatLogger",
        "braid.engine.vllm_stats",
        instance=("histogram_inter_token_latency",),
    ),
    Name(
        "vllm.v1.metrics.loggers",
        "PrometheusStatLogger.record",
        "braid.engine.vllm_stats",
        keywords=("scheduler_stats", "iteration_stats", "engine_idx"),
    ),
    Name("vllm.v1.metrics.loggers", "PrometheusStatLogger.log_engine_initialized", "braid.engine.vllm_stats"),
    Name(
        "vllm.v1.metrics.stats", "IterationStats", "braid.engine.vllm_stats", instance=("inter_token_latencies_iter",)
    ),
    Name(
        "prometheus_client.metrics",
        "Histogram",
        "braid.engine.vllm_stats",
        instance=("_upper_bounds", "_buckets", "_sum"),
    ),
    # the tool and reasoning parsers
    Name("vllm.parser", "ParserManager.get_parser", "braid.engine.vllm_parsers"),
    Name("vllm.parser.abstract_parser", "Parser.adjust_request", "braid.engine.vllm_parsers"),
    Name("vllm.parser.abstract_parser", "Parser.reasoning_parser", "braid.engine.vllm_parsers"),
    Name(
        "vllm.parser.abstract_parser",
        "Parser.parse_delta",
        "braid.engine.vllm_parsers",
        keywords=("prompt_token_ids", "finished"),
    ),
    Name(
        "vllm.parser.abstract_parser",
        "Parser.parse",
        "braid.engine.vllm_parsers",
        keywords=("enable_auto_tools", "model_output_token_ids"),
    ),
    Name("vllm.parser.abstract_parser", "Parser.count_reasoning_tokens", "braid.engine.vllm_parsers"),
    Name("vllm.parser.abstract_parser", "Parser.set_prompt_token_ids", "braid.engine.vllm_parsers"),
    Name("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest", "braid.engine.vllm_parsers"),
    Name(
        "vllm.entrypoints.openai.chat_completion.protocol",
        "ChatCompletionRequest.resolve_reasoning_ended",
        "braid.engine.vllm_parsers",
    ),
    Name("vllm.reasoning", "ReasoningParserManager.list_registered", "braid.engine.vllm_parsers"),
    Name("vllm.tool_parsers", "ToolParserManager.list_registered", "braid.engine.vllm_parsers"),
    Name("vllm.renderers.chat_utils", "make_tool_call_id", "braid.engine.vllm_parsers"),
    Name("vllm.utils.import_utils", "import_plugin", "braid.engine.vllm_parsers"),
)


def _resolve(name: Name) -> object:
    obj: object = importlib.import_module(name.module)
    for part in filter(None, name.path.split(".")):
        obj = getattr(obj, part)
    return obj


def _instance_attributes(cls: type) -> set[str]:
    """What instances of ``cls`` carry: its fields (dataclass, msgspec, attrs), its slots, and
    every ``self.NAME =`` in the ``__init__`` of it and of its bases (and in the methods those
    call: the whole class body is searched, since an attribute may be set outside ``__init__``)."""
    found: set[str] = set()
    if dataclasses.is_dataclass(cls):
        found |= {f.name for f in dataclasses.fields(cls)}
    found |= set(getattr(cls, "__struct_fields__", ()))
    for klass in cls.__mro__:
        found |= set(getattr(klass, "__slots__", ()))
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        found |= {line.split("self.", 1)[1].split("=")[0].split(":")[0].strip() for line in source.splitlines()
                  if "self." in line and "=" in line.split("self.", 1)[1]}  # fmt: skip
    return found


def missing(name: Name) -> list[str]:
    """What of ``name`` the installed packages lack, each as one line naming braid's module."""
    where = f"(relied on by {name.used_by})"
    try:
        obj = _resolve(name)
    except (ImportError, AttributeError) as exc:
        return [f"{name} is gone {where}: {exc}"]
    out = []
    if name.instance:
        assert isinstance(obj, type), name
        have = _instance_attributes(obj)
        out += [f"{name}: instances no longer carry {attr!r} {where}" for attr in name.instance if attr not in have]
    if name.keywords:
        params = inspect.signature(obj).parameters  # type: ignore[arg-type]
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        out += [
            f"{name} no longer takes the keyword {kw!r} {where}"
            for kw in name.keywords
            if kw not in params and not takes_any
        ]
    return out


@pytest.mark.parametrize("name", NAMES, ids=str)
def test_every_vllm_name_braid_relies_on_exists(name: Name) -> None:
    problems = missing(name)
    assert not problems, "\n".join(problems)


def test_a_moved_name_is_named_with_the_module_that_relies_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: as if vLLM had renamed what braid reads and passes."""
    from vllm.v1.engine.output_processor import OutputProcessor

    monkeypatch.delattr(OutputProcessor, "update_scheduler_stats")
    (gone,) = missing(Name("vllm.v1.engine.output_processor", "OutputProcessor.update_scheduler_stats", CORE))
    assert gone.startswith("vllm.v1.engine.output_processor:OutputProcessor.update_scheduler_stats is gone")
    assert "braid.engine.vllm_core" in gone
    renamed = Name("vllm.v1.metrics.stats", "IterationStats", "braid.engine.vllm_stats", instance=("itl_renamed",))
    assert missing(renamed) == [
        "vllm.v1.metrics.stats:IterationStats: instances no longer carry 'itl_renamed' "
        "(relied on by braid.engine.vllm_stats)"
    ]
    kw = Name("vllm.outputs", "RequestOutput.add", CORE, keywords=("aggregate", "merge_renamed"))
    assert missing(kw) == [
        "vllm.outputs:RequestOutput.add no longer takes the keyword 'merge_renamed' (relied on by braid.engine.vllm_core)"
    ]
