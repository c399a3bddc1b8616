"""The Trio-facing engine interface, shaped after vLLM's ``AsyncLLM``.

One engine request is one prompt with its sampling parameters (``n`` choices are sampled by the
engine itself, as vLLM's parallel sampling does). A request is opened as an async context manager
that yields an async iterator of :class:`EngineOutput` deltas::

    async with engine.open_request(request) as outputs:
        async for output in outputs:
            ...

Contract:

* Every output carries only new tokens (vLLM's ``RequestOutputKind.DELTA``); an engine may merge
  several pending deltas of one choice into one output when the consumer lags.
* A request marked ``final_only`` (a non-streaming response, which is sent only when complete)
  may instead come as one output holding every choice's whole completion (vLLM's
  ``RequestOutputKind.FINAL_ONLY``): the same sum of deltas, without one hand-over per step.
* ``prompt_logprobs`` is set on the first output only.
* The last output has ``finished=True``, and every choice has had exactly one delta with a
  non-null ``finish_reason`` by then.
* Leaving the ``async with`` block before the last output **aborts** the request; when
  ``__aexit__`` returns, the abort has run (the engine holds no work for it). Leaving it by
  cancellation is the normal way to abort, so engines shield and bound whatever ``__aexit__``
  awaits.
* Failures raise :class:`~braid.errors.EngineError` (generation failed) or
  :class:`~braid.errors.EngineRejected` (the engine's own validation refused the request).
* **A failure is reported when the engine knows it, not when the reader gets there.** A reader
  may be blocked for a long time (its client reads nothing), while the engine generates on. So
  ``open_request(request, on_failure)`` calls ``on_failure(error)`` as soon as the engine knows
  the request has failed (an error output, a rejection after the add, the engine dying, a fault
  hook), whether or not its outputs are being read: on the Trio thread, at most once, and never
  from inside the engine's own output processing (so the handler may abort requests). The
  iterator raises the same error when its reader gets there. A failure raised by
  ``open_request`` itself, before the block, is not reported this way; neither is an abort.
* **Outputs may be delivered where they are made.** ``open_request(request, on_failure,
  deliver)``: an engine may hand an output to ``deliver(output)`` at the moment it produces it
  (on the Trio thread), instead of waking the reader to yield it, but only while nothing of the
  request waits to be read. ``deliver`` returns True when it took the output; False when it
  cannot now (its consumer is full, or the request's run is ending), and the engine then keeps
  that output, merges later ones into it, and yields it from the iterator as usual. The
  iterator ends after the last output either way; a failure is never delivered (it is raised
  by the iterator). ``deliver`` does not call back into the engine, and an engine stops calling
  it once the block is left. The reader keeps the order: what it takes from the iterator goes
  to the same place as what ``deliver`` takes, ahead of later deliveries (braid's run sends both
  into one memory channel, where a blocked sender goes before any later ``send_nowait``). An
  engine that never calls it is correct; its reader just wakes once per output. (This saves a task switch per output on the hot path:
  docs/performance-log.md, round 10.)
* **Outputs may be observed as they are made.** ``open_request(request, on_failure, deliver,
  observe=observe)``: ``observe(output)`` is called with every output of the request as the
  engine makes it, one engine step at a time, in order, BEFORE any merging of deltas for a
  lagging reader (and before ``deliver``), on the Trio thread; it must not call back into the
  engine and must not raise. A tool-call parser needs each step's delta (several vLLM parsers
  lose calls when one delta carries several tokens). Not called for failures, nor once the
  block is left. A ``final_only`` request's outputs are observed as they are made too (an
  engine that makes only the final output, as vLLM's ``FINAL_ONLY`` does, observes that one).
  An engine whose outputs come merged from elsewhere (:class:`~braid.engine.vllm.VllmEngine`:
  ``AsyncLLM`` merges them before braid sees them) observes each as it receives it.
* **An engine may say when a request is about to end.** ``open_request(..., ending=Ending(after,
  call))``: once the request (of one choice) has generated ``after`` tokens, ``call()`` is called,
  at most once, on the Trio thread, outside the engine's own output processing, and never after
  the block is left (the step that makes the ``after``-th token may also end the request).
  braid's run hands the prompt's slots on then (:mod:`braid.stream.run`), so that the next
  prompt's request is in the engine's queue when this one's slot frees: with ``after`` a few
  tokens short of ``max_tokens`` the end is certain, and near. An engine that never calls it is
  correct; its slots are just handed on when the request has ended.
* A structured-output constraint (``SamplingParams.structured_outputs``) is checked with
  :func:`check_structured` before the response starts, so that a constraint the engine cannot
  compile is a 400, not an error after a stream's 200.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, runtime_checkable

import attrs
import msgspec

from braid.engine.constraint import Structured
from braid.errors import BraidError, InvalidRequest, ModelNotFound

TopLogprobs = Mapping[int, "Logprob"]
"""Logprobs at one position: token id -> logprob, the sampled (or actual prompt) token first."""


@attrs.frozen
class Logprob:
    logprob: float
    rank: int | None
    decoded_token: str


@attrs.frozen
class LoraAdapter:
    """A LoRA adapter the engine serves, which a request's ``model`` selects by ``name``: vLLM's
    ``LoRARequest(lora_name, lora_int_id, lora_path)``. ``parent`` is the served name of the base
    model it applies to (``/v1/models`` lists it, as vLLM does)."""

    name: str
    id: int = attrs.field(validator=attrs.validators.ge(1))
    path: str
    parent: str


@attrs.frozen
class ModelInfo:
    name: str
    root: str
    max_model_len: int = attrs.field(validator=attrs.validators.gt(0))
    vocab_size: int = attrs.field(validator=attrs.validators.gt(0))
    max_logprobs: int = 20
    max_num_seqs: int | None = None
    """The engine's cap on requests it runs at once (vLLM's scheduler; None: no cap)."""
    reserved_seqs: int = 0
    """Of ``max_num_seqs``, how many braid added for requests waiting for their first slot
    (``braid.stream.admit``'s reserve); the rest is what the operator asked for."""
    adapters: tuple[LoraAdapter, ...] = ()
    """The LoRA adapters served on top of the model (vLLM's ``--lora-modules``, then those loaded
    at run time: :mod:`braid.engine.adapters`), by name."""
    engine_version: str | None = None
    """The version of vLLM running the model (``GET /version``); None for an engine that is not vLLM."""


def served_names(info: ModelInfo) -> tuple[str, ...]:
    """The names a request's ``model`` may give: the model's, then its adapters'."""
    return (info.name, *(a.name for a in info.adapters))


def select_model(info: ModelInfo, requested: str | None) -> LoraAdapter | None:
    """What a request's ``model`` selects, as vLLM's server resolves it: the base model (None) for
    its served name or no name, else the adapter of that name; any other name is vLLM's 404."""
    if not requested or requested == info.name:
        return None
    for adapter in info.adapters:
        if adapter.name == requested:
            return adapter
    raise ModelNotFound(f"The model `{requested}` does not exist.", param="model")


class PassThrough(msgspec.Struct, frozen=True):
    """The sampling fields braid passes to the engine as the client sent them: each is declared
    here, once, and nowhere else.

    The one declaration makes the field part of the request body (the wire body,
    :class:`braid.wire.fields.SamplingBody`, inherits this Struct: the field is decoded with this
    type, strictly, and described in the OpenAPI document), of the validated request
    (:class:`SamplingParams` carries the decoded values as ``passthrough``), and of the engine's
    parameters (:func:`braid.engine.vllm_common.vllm_sampling_params` passes each field that is
    not ``None`` to vLLM's ``SamplingParams`` under its own name; ``None``, the client's ``null``
    or an absent field, leaves vLLM's default).

    To add a pass-through field:

    1. declare it below under vLLM's name, with the type the body takes (a JSON array as a
       ``tuple``), nullable with a ``None`` default, or with vLLM's default if vLLM's server does
       not take ``null`` for it;
    2. if braid bounds its value beyond its type (a range, a length cap), add the check to
       :func:`braid.wire.fields.check_fields`, naming the field as ``param``;
    3. give it a value in the tests that send every sampling field
       (tests/engine/test_vllm_common.py: ``SET`` and the body of
       ``test_every_sampling_field_of_the_body_reaches_vllms_sampling_params``;
       tests/wire/test_completions_request.py:
       ``test_every_sampling_field_of_the_body_reaches_the_engine_params``), which fail until it
       is set there and reaches vLLM's ``SamplingParams``.

    A field braid reads itself (the scripted engine, the plan), or whose wire form differs from
    vLLM's, is not a pass-through one: it goes in :class:`SamplingParams` and in the body,
    converted by :func:`braid.wire.fields.sampling_params` and, if need be, by
    :func:`~braid.engine.vllm_common.vllm_sampling_params`.

    The scripted engine accepts these fields and ignores them.
    """

    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] | None = None
    stream_interval: int | None = None
    """Tokens per streamed output (vLLM clamps it up to the engine's ``--stream-interval``; the
    first token and the last come at once)."""


@attrs.frozen
class SamplingParams:
    """What the engine samples with. Validated by braid before it reaches any engine.

    The fields braid reads or converts itself, and ``passthrough``: the fields it hands on as they
    came (:class:`PassThrough`, where a new plain field is declared). Each field here is filled
    by :func:`braid.wire.fields.sampling_params` from the body field of the same name (absent or
    null: the default here; the fields whose wire form differs are converted there), and reaches
    vLLM's ``SamplingParams`` under its own name (:func:`braid.engine.vllm_common.vllm_sampling_params`).
    """

    max_tokens: int = attrs.field(validator=attrs.validators.ge(1))
    n: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    temperature: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] | None = None
    structured_outputs: Structured | None = None
    """The output's constraint (:mod:`braid.engine.constraint`), from ``structured_outputs``,
    ``response_format`` or the deprecated ``guided_*`` fields; vLLM's field of the same name."""
    kv_transfer_params: Mapping[str, Any] | None = attrs.field(default=None, hash=False)
    """For the engine's KV connector (disaggregated prefill/decode), as the client sent it; vLLM
    takes it in its ``SamplingParams.extra_args`` (:func:`braid.engine.vllm_common.vllm_sampling_params`).
    An engine without a connector ignores it, as the scripted engine does."""
    passthrough: PassThrough = attrs.field(factory=PassThrough)
    """The fields passed to the engine as the client sent them."""


@attrs.frozen
class EngineRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    prompt_text: str | None = None
    final_only: bool = False  # only the finished result is needed (see the module docstring)
    priority: int = 0  # the engine's order among waiting requests, when it schedules by priority
    # Through a reasoning parser (vLLM's serving layer sets the same on its engine requests):
    # whether the prompt already ended the reasoning, so that a grammar applies from the first
    # token (None: the engine's own reasoning parser checks the prompt), and the request's
    # template kwargs for that parser (enable_thinking...).
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: Mapping[str, Any] | None = attrs.field(default=None, eq=False)
    lora: LoraAdapter | None = None
    """The LoRA adapter to generate with (:func:`select_model`); None: the base model."""


@attrs.frozen
class ChoiceDelta:
    """New tokens of one choice (``index`` is the choice's position among the prompt's ``n``)."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TopLogprobs, ...] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@attrs.frozen
class EngineOutput:
    prompt_token_ids: tuple[int, ...]
    choices: tuple[ChoiceDelta, ...]
    finished: bool = False
    prompt_logprobs: tuple[TopLogprobs | None, ...] | None = None
    num_cached_tokens: int | None = None
    """How many of the prompt's tokens the engine found in its prefix cache (None: not reported)."""
    kv_transfer_params: Mapping[str, Any] | None = attrs.field(default=None, hash=False)
    """What the engine's KV connector gives the next stage of a disaggregated deployment, on the
    request's finished output (vLLM's ``RequestOutput.kv_transfer_params``); None without one."""


FailureHandler = Callable[[BraidError], None]
"""Called with a request's error as soon as the engine knows it failed (see the module docstring)."""

Deliver = Callable[[EngineOutput], bool]
"""Takes an output where the engine makes it, or says it cannot now (see the module docstring)."""

Observe = Callable[[EngineOutput], None]
"""Sees each output as the engine makes it, before any merging (see the module docstring)."""


@attrs.frozen
class Ending:
    """When to tell a request's owner that its end is near (see the module docstring)."""

    after: int = attrs.field(validator=attrs.validators.ge(1))
    """Generated tokens after which :attr:`call` is called."""
    call: Callable[[], None] = attrs.field(eq=False)


class Tokenizer(Protocol):
    """A model's tokenizer, used on the Trio thread. ``decode``, ``token_strs`` and
    ``apply_chat_template`` only read it, so braid also calls them from its one tokenizing
    thread (braid.stream.tokenize, braid.routes.tokenize) while the Trio thread goes on using it."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_chars_per_token(self) -> int:
        """The longest token's text, in characters (vLLM's bound: a text of more than
        ``max_model_len * max_chars_per_token`` characters is refused before tokenizing)."""
        ...

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def encode_many(self, texts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]:
        """``[encode(t) for t in texts]``, safe to call from one worker thread at a time while the
        Trio thread goes on using this tokenizer (braid.stream.tokenize): it must not share mutable
        state with ``encode``/``decode``, and should release the GIL while it works."""
        ...

    def decode(self, token_ids: tuple[int, ...] | list[int], *, skip_special_tokens: bool = True) -> str: ...

    def token_text(self, token_id: int) -> str:
        """The text of one token as logprobs show it (special tokens included)."""
        ...

    def token_strs(self, token_ids: Sequence[int]) -> list[str]:
        """Each token as the vocabulary spells it (Hugging Face's ``convert_ids_to_tokens``:
        a byte-level BPE's ``"Ġw"``, not the text ``" w"``): ``token_strs`` of ``POST /tokenize``."""
        ...

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
        """The conversation as the model's chat template renders it (a text, not token ids).

        ``messages`` are the dicts vLLM's server hands a template (``braid.wire.messages``:
        ``role`` and ``content`` as text, an assistant's ``tool_calls`` with their arguments as
        objects, a tool message's ``tool_call_id``...); ``tools`` the request's tools as vLLM
        dumps them (None: no tools, which a template may tell apart from ``[]``);
        ``template_kwargs`` further template variables (never ``tools``). A model's template may
        be chosen by whether there are tools (Hugging Face's named ``tool_use`` template), as
        vLLM chooses it. Raises :class:`~braid.errors.InvalidRequest` when the model has no
        template and none is given."""
        ...

    def parser_tokenizer(self) -> Any:
        """The tokenizer vLLM's tool-call and reasoning parsers read (Hugging Face's interface);
        loaded on first call."""
        ...


class Engine(Protocol):
    @property
    def info(self) -> ModelInfo: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def healthy(self) -> bool: ...

    def unfinished_requests(self) -> int:
        """The engine's own count of requests it has not finished (a gauge read at scrape time)."""
        ...

    def open_request(
        self,
        request: EngineRequest,
        on_failure: FailureHandler | None = None,
        deliver: Deliver | None = None,
        *,
        observe: Observe | None = None,
        ending: Ending | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[EngineOutput]]: ...

    def abort_requests(self, request_ids: Sequence[str]) -> None:
        """Start aborting these requests at once, without waiting; unknown or finished ids are ignored.

        A run calls it when it is cancelled or fails, before its drivers unwind, so the engine
        drops the whole batch in one step instead of one request per driver clean-up. It only
        speeds the abort up: each ``open_request`` block still aborts its own request on exit.
        """
        ...

    # Optional: ``check_structured(self, params: SamplingParams) -> None``, see check_structured;
    # ``add_lora(self, adapter, *, inplace) -> None``, see LoraLoader.


@runtime_checkable
class StructuredChecker(Protocol):
    """An engine that supports structured output (see :func:`check_structured`)."""

    def check_structured(self, params: SamplingParams) -> None: ...


@runtime_checkable
class LoraLoader(Protocol):
    """An engine that loads LoRA adapters while it runs (:mod:`braid.engine.adapters`).

    ``add_lora`` loads the adapter's weights under its ``id`` (``inplace``: again, over those of
    that id, as vLLM's ``load_inplace``); it returns once the engine has them, and raises
    :class:`~braid.errors.ModelNotFound` when there is no adapter at its path (vLLM's message),
    :class:`~braid.errors.InvalidRequest` when the engine cannot take it (LoRA off, a rank over
    ``--max-lora-rank``, modules the model lacks), :class:`~braid.errors.EngineUnavailable` when
    the engine is down. It does not change ``info``: the caller does, once it has returned, and
    is the only writer of ``info.adapters`` after start-up."""

    info: ModelInfo

    async def add_lora(self, adapter: LoraAdapter, *, inplace: bool = False) -> None: ...


def check_structured(engine: Engine, params: SamplingParams) -> None:
    """Refuse, before anything is committed, a structured-output constraint the engine cannot run.

    An engine that supports structured output has a method ``check_structured(params)``: it
    returns if the engine can compile ``params.structured_outputs`` (it is not None), and raises
    :class:`~braid.errors.InvalidRequest` naming the field otherwise (a regex or schema its backend
    refuses, a kind it does not implement). It must be quick (it runs on the Trio thread, for
    each request that has a constraint) and must not change the engine's state. An engine without
    the method refuses every constraint. Requests without one are not checked.
    """
    structured = params.structured_outputs
    if structured is None:
        return
    if not isinstance(engine, StructuredChecker):
        raise InvalidRequest("This engine does not support structured output.", param=structured.source)
    engine.check_structured(params)
