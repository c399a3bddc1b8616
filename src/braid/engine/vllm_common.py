"""What braid's two vLLM clients share (:mod:`.vllm_core`, the default, and :mod:`.vllm`'s
``AsyncLLM`` client): the environment vLLM needs before its first import, braid's tokenizer over
the model's Hugging Face tokenizer, vLLM's outputs and errors as braid's, braid's sampling
parameters as vLLM's, and the ``braid:fail@S`` fault hook. Imports vLLM only inside functions.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import msgspec
import trio

from braid.engine.adapters import adapter_not_found
from braid.engine.base import (
    ChoiceDelta,
    EngineOutput,
    EngineRequest,
    Logprob,
    LoraAdapter,
    Observe,
    SamplingParams,
    TopLogprobs,
)
from braid.engine.constraint import Structured
from braid.engine.faults import fault_after, injected_failure
from braid.errors import ENGINE_DOWN, BraidError, EngineError, EngineRejected, EngineUnavailable, InvalidRequest

# What vLLM needs on a CPU machine. tools/servers.py gives vLLM's
# own server the same, so the parity tier and the benchmarks compare like with like.
OFFLINE_ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
CPU_ENVIRONMENT = {
    "VLLM_TARGET_DEVICE": "cpu",
    # vLLM torch.compiles its logprobs op even with enforce_eager, which stalls the first request
    # that asks for logprobs (docs/performance-log.md).
    "TORCH_COMPILE_DISABLE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # the "uni" executor is silently replaced by "mp" unless this is 0
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
CPU_ENGINE_ARGS = {"enforce_eager": True, "dtype": "float32", "distributed_executor_backend": "uni"}


# vLLM's admission caps (its --max-num-queued-reqs and --max-num-queued-tokens) are checked only
# in AsyncLLM.add_request, which the default client (engine/vllm_core.py) does not call: the
# engine would take every request while the flag promised otherwise. braid's own admission
# limits replace them for both clients, so that a flag means the same with either.
_ADMISSION_ARGS = ("max_num_queued_reqs", "max_num_queued_tokens")


def check_engine_args(kwargs: Mapping[str, Any]) -> None:
    """Refuse the vLLM engine arguments that braid would silently not honour: :class:`ValueError`
    whose message names each one and what to use instead. Values that mean "off" (``None``, a
    data-parallel size of 1) pass. ``braid serve`` calls it before anything starts, and
    :func:`~braid.engine.vllm.open_vllm_engine`, where both clients start, calls it again."""
    problems = [
        f"--engine-arg {name} is not supported: vLLM checks it only in AsyncLLM.add_request, which "
        "braid's default engine client does not call. Use braid's own admission limits: "
        "--max-in-flight-requests and --max-queued-requests."
        for name in _ADMISSION_ARGS
        if kwargs.get(name) is not None
    ]
    dp = kwargs.get("data_parallel_size")
    if isinstance(dp, int) and dp > 1:
        problems.append(
            f"--engine-arg data_parallel_size={dp} is not supported: braid drives one engine core and "
            "would send every request to data-parallel rank 0. Run one braid per rank behind vLLM's "
            "router (vllm-router) or nginx instead: docs/deploy.md, 'Scale-out'."
        )
    if problems:
        raise ValueError("\n".join(problems))


def prepare_environment(*, cpu: bool) -> None:
    """Set the environment vLLM reads at import time (values already set by the user win)."""
    for key, value in {**OFFLINE_ENVIRONMENT, **(CPU_ENVIRONMENT if cpu else {})}.items():
        os.environ.setdefault(key, value)


VLLM_VERSION = "0.32.0"
"""The vLLM braid drives, and the one its tests run: braid reaches into vLLM's internals (the
engine-core client, the output processor, the stat logger, the parser manager;
tests/engine/test_vllm_upstream_names.py lists each name), which change between releases.
pyproject.toml pins both extras to it; README, "Moving to a newer vLLM", says how to move."""


def installed_vllm_version() -> str | None:
    """The installed vLLM's version (the ``vllm`` distribution, or the CPU build's ``vllm-cpu``),
    read from its metadata without importing it; None when neither is installed."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def check_vllm_version(installed: str | None) -> None:
    """:class:`ValueError` with one line naming the vLLM braid needs, unless ``installed`` is that
    release (a local build tag such as ``+cpu`` is the same release); None (no vLLM) passes."""
    if installed is None or installed.split("+", 1)[0] == VLLM_VERSION:
        return
    raise ValueError(
        f"braid drives vLLM {VLLM_VERSION} (the version its tests run), and vLLM {installed} is installed: "
        f"install vllm=={VLLM_VERSION} (make install EXTRAS=test,gpu pins it), or see README, "
        "'Moving to a newer vLLM'"
    )


def is_cpu_build() -> bool:
    try:
        from importlib.metadata import version

        version("vllm-cpu")
        return True
    except Exception:  # noqa: BLE001 - not installed under that name
        return False


log = logging.getLogger("braid.engine")

_PROBES = ("Hello, world!", " leading space\tand tab\n", "naïve café 東京 🙂", "def f(x):\n    return x", "<s>a</s>")


class HfTokenizer:
    """braid's Tokenizer protocol over a Hugging Face tokenizer (braid's own instance).

    ``encode_many`` (braid.stream.tokenize's worker thread) uses a private copy of the Rust backend, so
    it shares no state with the Trio thread's instance, and the backend releases the GIL while it
    encodes a batch. The copy is used only if it encodes like ``encode`` on a few probes (a
    tokenizer class may add its own steps in Python); otherwise, and for slow tokenizers, the
    worker loops ``encode`` over a deep copy of the whole tokenizer. ``encode`` (the Trio thread)
    calls the tokenizer's own Rust backend directly when it passed the same probes: the
    ``transformers`` wrapper around it costs about as much again per prompt.
    """

    def __init__(self, tok: Any, vocab_size: int, *, trust_remote_code: bool = False) -> None:
        self._tok = tok
        self.vocab_size = vocab_size
        self._trust_remote_code = trust_remote_code  # how ``tok`` was loaded: parser_tokenizer loads alike
        self._parser_tokenizer: Any = None
        # vLLM's own rule (its Hugging Face tokenizer wrapper): the longest vocabulary entry, as stored.
        self.max_chars_per_token = max((len(t) for t in tok.get_vocab()), default=1)
        self._worker_backend: Any = None
        self._worker_tok: Any = None
        self._backend: Any = None  # the Trio thread's fast path (encode)
        backend = getattr(tok, "_tokenizer", None)
        if backend is not None and hasattr(backend, "encode_batch") and hasattr(backend, "to_str"):
            try:
                copy_ = type(backend).from_str(backend.to_str())
                if all(
                    copy_.encode(p, add_special_tokens=s).ids == tok.encode(p, add_special_tokens=s)
                    for p in _PROBES
                    for s in (True, False)
                ):
                    self._worker_backend = copy_
            except Exception:  # noqa: BLE001 - an exotic backend: take the slow path below
                log.warning("the tokenizer's backend cannot be copied; large batches tokenize more slowly")
            try:
                if all(
                    backend.encode(p, add_special_tokens=s).ids == tok.encode(p, add_special_tokens=s)
                    for p in _PROBES
                    for s in (True, False)
                ):
                    self._backend = backend
            except Exception:  # noqa: BLE001 - an exotic backend: encode through the wrapper
                pass
        if self._worker_backend is None:
            try:
                self._worker_tok = copy.deepcopy(tok)
            except Exception:  # noqa: BLE001
                # Encoding alone does not change a tokenizer's state; sharing it is the last resort.
                log.warning("the tokenizer cannot be copied; the tokenizing thread shares it")
                self._worker_tok = tok

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def encode_many(self, texts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]:
        if self._worker_backend is not None:
            return [e.ids for e in self._worker_backend.encode_batch(texts, add_special_tokens=add_special_tokens)]
        tok = self._worker_tok
        return [list(tok.encode(t, add_special_tokens=add_special_tokens)) for t in texts]

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self._tok.decode([token_id])

    def token_strs(self, token_ids: Sequence[int]) -> list[str]:
        # None for an id the tokenizer does not know (a model may have more ids than its tokenizer)
        return [t or "" for t in self._tok.convert_ids_to_tokens(list(token_ids))]

    def parser_tokenizer(self) -> Any:
        """vLLM's own tokenizer for the model (``vllm.tokenizers.get_tokenizer``: its cached
        Hugging Face tokenizer, whose ``get_vocab`` does not rebuild the vocabulary at each call,
        which some parsers make at every construction), loaded from where braid's was, once."""
        if self._parser_tokenizer is None:
            from vllm.tokenizers import get_tokenizer

            self._parser_tokenizer = get_tokenizer(self._tok.name_or_path, trust_remote_code=self._trust_remote_code)
        return self._parser_tokenizer

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
        chat_template: str | None,
        template_kwargs: Mapping[str, Any],
        tools: list[Mapping[str, Any]] | None = None,
    ) -> str:
        """As vLLM 0.32's ``safe_apply_chat_template``: the template is the request's (a jinja
        text, or the name of one of the model's templates) or the model's, picked by whether there
        are tools (a tokenizer with named templates has ``tool_use`` and ``default``); a template
        that never names the ``developer`` role gets developer messages as system messages, all
        system messages merged into one at the front (:func:`developer_as_system`)."""
        template = self._template(chat_template, tools)
        if any(m["role"] == "developer" for m in messages) and not _names_developer(template):
            messages = developer_as_system(messages)
        # transformers renders in a sandboxed jinja environment, as vLLM's server does.
        kwargs = {k: v for k, v in template_kwargs.items() if k not in _TEMPLATE_OWN}
        return str(
            self._tok.apply_chat_template(
                messages,
                tools=tools,
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=False,
                **kwargs,
            )
        )

    def _template(self, chat_template: str | None, tools: list[Mapping[str, Any]] | None) -> str:
        """The jinja text to render with, resolved as transformers resolves it for vLLM."""
        resolve = getattr(self._tok, "get_chat_template", None)
        if resolve is None:  # not a transformers tokenizer: its one template
            template = chat_template or getattr(self._tok, "chat_template", None)
        else:
            try:
                template = resolve(chat_template, tools=tools)
            except ValueError:  # no template, or named templates and no default among them
                template = None
        if not isinstance(template, str):  # "" is a template, as in vLLM: it renders nothing
            raise InvalidRequest(NO_CHAT_TEMPLATE)
        return template


def _names_developer(template: str) -> bool:
    """vLLM's test of whether a template knows the developer role: it names it in quotes."""
    return '"developer"' in template or "'developer'" in template


def developer_as_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's ``_convert_developer_to_system`` then ``_consolidate_system_messages``: each
    developer message becomes a system message (its ``tools`` dropped); then, when a system
    message is not first or there are several, they all become one system message at the front,
    ``{role, content}`` only, their non-empty texts joined by blank lines, the other messages
    following in their order."""
    converted = [
        {k: v for k, v in {**m, "role": "system"}.items() if k != "tools"} if m["role"] == "developer" else m
        for m in messages
    ]
    texts: list[str] = []
    others: list[dict[str, Any]] = []
    merge = False
    for i, m in enumerate(converted):
        if m["role"] != "system":
            others.append(m)
            continue
        # vLLM's condition, as it is: a system message after the first place, or after one with text
        merge = merge or i > 0 or bool(texts)
        content = m.get("content", "")  # a text: braid hands templates text content
        if content:
            texts.append(content)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(texts)}, *others]


NO_CHAT_TEMPLATE = (
    "This model has no chat template: chat requests need one (the tokenizer's chat_template, "
    "or a request's chat_template where the server allows it)."
)
# Arguments of apply_chat_template itself, which chat_template_kwargs may not override.
_TEMPLATE_OWN = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "chat_template",
        "tokenize",
        "add_generation_prompt",
        "continue_final_message",
    }
)


def _top(d: Mapping[int, Any] | None) -> TopLogprobs | None:
    if d is None:
        return None
    return {t: Logprob(lp.logprob, lp.rank, lp.decoded_token or "") for t, lp in d.items()}


def convert_output(ro: Any) -> EngineOutput:
    choices = []
    for o in ro.outputs:
        if o.finish_reason == "error":
            raise EngineError("Internal server error")
        logprobs = None if o.logprobs is None else tuple(_top(d) or {} for d in o.logprobs)
        choices.append(ChoiceDelta(o.index, o.text, tuple(o.token_ids), logprobs, o.finish_reason, o.stop_reason))
    prompt_lps = None if ro.prompt_logprobs is None else tuple(_top(d) for d in ro.prompt_logprobs)
    return EngineOutput(
        tuple(ro.prompt_token_ids or ()),
        tuple(choices),
        bool(ro.finished),
        prompt_lps,
        ro.num_cached_tokens,
        ro.kv_transfer_params,
    )


def map_error(exc: BaseException) -> BraidError:
    """vLLM's exceptions -> braid's error types (see braid.errors)."""
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(exc, BraidError):
        return exc
    if isinstance(exc, EngineDeadError):
        return EngineUnavailable(ENGINE_DOWN)
    # vLLM's request checks raise VLLMValidationError, which 0.32 no longer derives from ValueError.
    if isinstance(exc, VLLMValidationError | ValueError | TypeError | OverflowError):
        return EngineRejected(str(exc), param=getattr(exc, "parameter", None))
    return EngineError(f"The engine failed: {type(exc).__name__}: {exc}")


def vllm_structured(s: Structured) -> Any:
    """braid's constraint -> vLLM's ``StructuredOutputsParams`` (the same field names; a
    ``json_object`` that is not set is vLLM's ``None``, as its False is an error)."""
    from vllm.sampling_params import StructuredOutputsParams

    kwargs = attrs.asdict(s, recurse=False, filter=lambda a, _: a.name != "source")
    kwargs["choice"] = None if s.choice is None else list(s.choice)
    kwargs["json_object"] = True if s.json_object else None
    return StructuredOutputsParams(**kwargs)


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "logit_bias": dict,  # ((token id, bias), ...) -> {token id: bias}
    "structured_outputs": vllm_structured,
}
"""The fields of :class:`SamplingParams` whose vLLM form differs from braid's (a tuple needs no
entry: it becomes a list), when they are not ``None``."""


def vllm_sampling_params(params_cls: Any, kind: Any, p: SamplingParams, *, final_only: bool = False) -> Any:
    """braid's validated SamplingParams -> vLLM's (``kind`` is vLLM's RequestOutputKind).

    Every field goes to vLLM under its own name: each field of ``p`` but ``passthrough``, and each
    field of ``p.passthrough`` (:class:`~braid.engine.base.PassThrough`) that is not ``None``
    (``None`` leaves vLLM's default). A tuple becomes the list vLLM's checks expect; the fields
    of ``_CONVERT`` take vLLM's form. The one exception is ``kv_transfer_params``, which goes
    where vLLM's server puts it: ``extra_args={"kv_transfer_params": ...}``, when it is a
    non-empty object.
    """
    kwargs = attrs.asdict(p, recurse=False)
    passthrough = kwargs.pop("passthrough")
    kv = kwargs.pop("kv_transfer_params")
    if kv:  # vLLM's own test (an empty object is not passed)
        # A copy per engine request: a KV connector may write into it, and the prompts and
        # choices of one request must not share it.
        kwargs["extra_args"] = {"kv_transfer_params": copy.deepcopy(dict(kv))}
    kwargs.update((name, value) for name, value in msgspec.structs.asdict(passthrough).items() if value is not None)
    for name, value in kwargs.items():
        if value is None:
            continue
        convert = _CONVERT.get(name)
        if convert is not None:
            kwargs[name] = convert(value)
        elif isinstance(value, tuple):
            kwargs[name] = list(value)
    # FINAL_ONLY for a non-streaming response, as vLLM's own server does: one output per
    # request instead of one per step, each of which crosses to the Trio thread. skip_clone, as
    # vLLM's server sets it: these params are made for one engine request, every container in
    # them new (the lists above, the structured params), so vLLM's input processor need not
    # deep-copy them again (a deepcopy per prompt: 3 % of the Trio thread in a batch job).
    kind_of = kind.FINAL_ONLY if final_only else kind.DELTA
    return params_cls(**kwargs, output_kind=kind_of, skip_clone=True)


def check_structured(input_processor: Any, params_cls: Any, p: SamplingParams) -> None:
    """vLLM's own check of ``p``'s constraint, as its input processor makes it when the request is
    added (``SamplingParams.verify``, with the engine's structured-output config and tokenizer):
    the backend vLLM picks (``auto``: xgrammar, else guidance, else outlines) parses the schema,
    regex or grammar, without compiling it against the vocabulary (the engine core does that
    when it schedules the request). Raises :class:`~braid.errors.InvalidRequest` naming the
    field the constraint came from.

    It runs on a throw-away vLLM ``SamplingParams``, because the check rewrites the constraint it
    is given (a choice becomes a grammar, the backend is recorded); the request's own is checked
    again, by the same code, when it is added. Well under a millisecond for a small schema (the
    first call imports the backends: some 20 ms).
    """
    structured = p.structured_outputs
    if structured is None:
        return
    from vllm.exceptions import VLLMValidationError

    ip = input_processor
    try:
        throwaway = params_cls(max_tokens=1, structured_outputs=vllm_structured(structured))
        throwaway.verify(ip.model_config, ip.speculative_config, ip.structured_outputs_config, ip.tokenizer)
    except (VLLMValidationError, ValueError, TypeError) as exc:  # vLLM 0.32's is no ValueError
        # The message alone: VLLMValidationError's str() appends the rejected value, a whole schema.
        message = exc.args[0] if exc.args else str(exc)
        raise InvalidRequest(f"{structured.source}: {message}", param=structured.source) from None


def vllm_lora_request(adapter: LoraAdapter | None, *, inplace: bool = False) -> Any:
    """braid's adapter -> vLLM's ``LoRARequest`` (None: the base model); ``inplace``: its
    ``load_inplace`` (the engine reloads the weights of that id)."""
    if adapter is None:
        return None
    from vllm.lora.request import LoRARequest

    return LoRARequest(adapter.name, adapter.id, adapter.path, load_inplace=inplace)


LORA_OFF = "LoRA is not enabled: start the server with --enable-lora to load LoRA adapters."


def lora_load_error(adapter: LoraAdapter, exc: BraidError) -> BraidError:
    """What a failed ``add_lora`` of the engine is to the client (see
    :class:`braid.engine.base.LoraLoader`): vLLM's 404 when the path holds no adapter (vLLM tells
    it from the failure's text, as here), the engine's own error when it is down, and a 400
    with the engine's reason otherwise (vLLM: a 500)."""
    if isinstance(exc, EngineUnavailable):
        return exc
    missing = adapter_not_found(adapter.name, adapter.path)
    if missing.message in exc.message:
        return missing
    reason = exc.message.removeprefix("The engine failed: ").removeprefix("RuntimeError: ")
    reason = reason.removeprefix("Exception: ").removeprefix("Call to add_lora method failed: ")
    return InvalidRequest(f"Loading lora {adapter.name} failed: {reason}")


LORA_PROMPT_LOGPROBS = (
    "prompt_logprobs is not available with LoRA on vLLM's CPU build: its LoRA kernels fail on a "
    "step that computes prompt logprobs for two requests, which stops the engine (vllm#16668)."
)


def check_lora_prompt_logprobs(input_processor: Any, p: SamplingParams) -> None:
    """Refuse ``prompt_logprobs`` (a 400) when the engine has LoRA on and is vLLM's CPU build.

    vLLM 0.32's CPU LoRA wrapper applies the adapters to logits by request, and prompt logprobs
    compute logits for every prompt token: with two such requests in a step, its ``einsum``
    fails and the engine core dies, for every client, whether or not a request names an adapter
    (measured on the tiny model; vLLM's own server dies the same way). One request alone passes
    only because its shapes broadcast."""
    if p.prompt_logprobs is not None and input_processor.lora_config is not None and is_cpu_build():
        raise EngineRejected(LORA_PROMPT_LOGPROBS, param="prompt_logprobs")


def lora_adapters(modules: Sequence[tuple[str, str]], parent: str) -> tuple[LoraAdapter, ...]:
    """The adapters of ``--lora-modules`` (name, path), on the base model served as ``parent``:
    ids 1, 2, ... in order, as vLLM's server numbers them. A name given twice, or the base
    model's own name, is refused (:class:`ValueError`): a request could not select it."""
    names = [name for name, _ in modules]
    problems = sorted({name for name in names if names.count(name) > 1 or name == parent or not name})
    if problems:
        raise ValueError(
            f"--lora-modules: each adapter needs a name of its own, other than the model's ({parent!r}); "
            f"not {', '.join(map(repr, problems))}"
        )
    return tuple(LoraAdapter(name, i, path, parent) for i, (name, path) in enumerate(modules, 1))


async def load_adapters(add_lora: Callable[[LoraAdapter], Awaitable[Any]], adapters: Sequence[LoraAdapter]) -> None:
    """Load each adapter into the engine before the server starts (``add_lora``: the engine's,
    :class:`braid.engine.base.LoraLoader`), as vLLM's server loads its ``--lora-modules``: a
    path vLLM cannot load fails the start, not the first request that names the adapter."""
    for adapter in adapters:
        try:
            await add_lora(adapter)
        except BraidError as exc:
            raise ValueError(f"--lora-modules {adapter.name}={adapter.path}: {exc}") from exc


def fail_after(request: EngineRequest, fault_hooks: bool) -> int | None:
    """The ``S`` of a ``braid:fail@S`` fault hook in the prompt text (``--fault-hooks`` only)."""
    return fault_after(request.prompt_text) if fault_hooks else None


async def engine_outputs(
    receive_batch: Callable[[], Awaitable[Sequence[Any]]], fail_after: int | None, observe: Observe | None = None
) -> AsyncGenerator[EngineOutput, None]:
    """vLLM's RequestOutputs (``receive_batch`` raises ``trio.EndOfChannel`` at the end) as braid's
    EngineOutputs, failing as the fault hook says once more than ``fail_after`` tokens came; each
    output that does not fail is handed to ``observe`` before it is yielded."""
    produced = 0  # tokens of the longest choice so far
    while True:
        try:
            batch = await receive_batch()
        except trio.EndOfChannel:
            return
        for ro in batch:
            out = convert_output(ro)
            if fail_after is not None:
                produced += max((len(c.token_ids) for c in out.choices), default=0)
                if produced > fail_after:
                    raise injected_failure(fail_after)
            if observe is not None:
                observe(out)
            yield out
