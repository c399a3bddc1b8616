"""vLLM's tool-call and reasoning parsers, behind one module: the only file of braid that imports
``vllm.parser``, ``vllm.tool_parsers``, ``vllm.reasoning`` or vLLM's chat request model.

vLLM 0.32 parses reasoning and tool calls together: ``ParserManager.get_parser`` gives a parser
class for a tool-call parser name and a reasoning parser name, instantiated once per choice (its
stream state lives in the instance), with ``parse()`` for a whole output and ``parse_delta()`` for
a stream. Both take vLLM's pydantic ``ChatCompletionRequest``, which :class:`Parsers` builds once
per request, only for a request that has tools or when a reasoning parser is on. This API has
moved three times in a year; braid meets it here alone and hands the rest of braid its own values
(:mod:`braid.engine.tool_calls`).

* :func:`load_parsers` checks the names at start-up and gives the parser class, or raises
  :class:`ParserConfigError` whose message is one line listing the valid names.
* :meth:`Parsers.for_request` makes a request's parsers; :meth:`RequestParsers.choice` one
  :class:`VllmChoiceParser` per choice. braid feeds it the engine's deltas in their order, one
  engine step at a time, before any merging for a slow reader: vLLM's own server feeds its parser
  whatever one output holds, and several vLLM parsers lose calls when one delta carries several
  tokens. A parser that raises does not take the stream down: its text goes on as content and
  the error is logged.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser import ParserManager
from vllm.reasoning import ReasoningParserManager
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.tool_parsers import ToolParserManager
from vllm.utils.import_utils import import_plugin

from braid.engine.constraint import Structured
from braid.engine.tool_calls import ParsedDelta, ParsedOutput, ToolCall, ToolCallDelta
from braid.settings import ParserOptions

log = logging.getLogger("braid")


class ParserConfigError(ValueError):
    """A parser flag names what vLLM does not have, or what the model's tokenizer cannot use."""


def tool_parser_names() -> list[str]:
    return sorted(ToolParserManager.list_registered())


def reasoning_parser_names() -> list[str]:
    return sorted(ReasoningParserManager.list_registered())


def _import_plugin(plugin: str) -> None:
    # vLLM's import_plugin logs a traceback and goes on when the plugin is missing; braid stops.
    if not os.path.isfile(plugin):
        try:
            found = importlib.util.find_spec(plugin) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ParserConfigError(f"--tool-parser-plugin {plugin!r}: no such file or module")
    try:
        module = import_plugin(plugin)
    except Exception as exc:  # noqa: BLE001 - the plugin's own code, whatever it raised
        raise ParserConfigError(f"--tool-parser-plugin {plugin!r} failed: {' '.join(str(exc).split())}") from None
    if module is None:
        raise ParserConfigError(f"--tool-parser-plugin {plugin!r} could not be loaded (see the log)")


def check_parser_names(options: ParserOptions) -> None:
    """Refuse flags that name no parser of vLLM's (or go together wrongly), before the engine
    starts: :class:`ParserConfigError`, one line listing the valid names. A plugin
    (``tool_parser_plugin``: a module or a file) is imported first, so that the names it
    registers are valid: an operator's flag, never a request's."""
    if options.tool_parser_plugin:
        _import_plugin(options.tool_parser_plugin)
    if options.tool_call_parser is not None:
        if not options.enable_auto_tool_choice:
            raise ParserConfigError("--tool-call-parser needs --enable-auto-tool-choice (as vLLM's server)")
        names = tool_parser_names()
        if options.tool_call_parser not in names:
            raise ParserConfigError(
                f"--tool-call-parser {options.tool_call_parser!r} is not one of vLLM's: {', '.join(names)}"
            )
    elif options.enable_auto_tool_choice:
        raise ParserConfigError("--enable-auto-tool-choice needs --tool-call-parser NAME (as vLLM's server)")
    if options.reasoning_parser is not None:
        names = reasoning_parser_names()
        if options.reasoning_parser not in names:
            raise ParserConfigError(
                f"--reasoning-parser {options.reasoning_parser!r} is not one of vLLM's: {', '.join(names)}"
            )


def load_parsers(options: ParserOptions, tokenizer: Any, model_name: str | None = None) -> Parsers | None:
    """The parsers ``options`` name (:func:`check_parser_names`), checked against ``tokenizer``
    (a parser that needs tokens the model lacks is refused); None when none is named."""
    check_parser_names(options)
    if not options.active:
        return None
    try:
        cls = ParserManager.get_parser(
            tool_parser_name=options.tool_call_parser,
            reasoning_parser_name=options.reasoning_parser,
            enable_auto_tools=options.enable_auto_tool_choice,
            model_name=model_name,
            tokenizer=tokenizer,
        )
    except (TypeError, RuntimeError, KeyError) as exc:  # vLLM's refusals of a name or a tokenizer
        raise ParserConfigError(" ".join(str(exc).split())) from None
    if cls is None:
        return None
    return Parsers(cls, tokenizer, options)


@attrs.frozen
class Parsers:
    """The server's parser class, with the tokenizer it parses with (vLLM's cached tokenizer:
    some parsers read its whole vocabulary on every construction)."""

    cls: Any
    tokenizer: Any
    options: ParserOptions

    def for_request(
        self,
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        tool_choice: object,
        parallel_tool_calls: bool | None,
        chat_template_kwargs: Mapping[str, Any] | None,
        include_reasoning: bool = True,
    ) -> RequestParsers:
        """The parsers of one request (fields as the request's body has them, already
        validated). Builds vLLM's request model once (tens of microseconds)."""
        body: dict[str, Any] = {
            "model": "braid",
            "messages": [{"role": "user", "content": ""}],
            "include_reasoning": include_reasoning,
        }
        if tools:
            body["tools"] = list(tools)
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
        if parallel_tool_calls is not None:
            body["parallel_tool_calls"] = parallel_tool_calls
        if chat_template_kwargs:
            body["chat_template_kwargs"] = dict(chat_template_kwargs)
        request = ChatCompletionRequest.model_validate(body)
        return RequestParsers(self, request, dict(chat_template_kwargs or {}))


@attrs.frozen
class Adjustment:
    """What a request's parser asks of its engine request (:meth:`RequestParsers.constraint`)."""

    structured: Structured | None
    skip_special_tokens: bool


def _structured(so: Any) -> Structured:
    """vLLM's ``StructuredOutputsParams`` as braid's :class:`Structured` (the kinds its parsers
    make: a JSON schema, a structural tag, and the rest for a parser that makes them)."""
    source = "tool_choice"
    if so.json is not None:
        text = so.json if isinstance(so.json, str) else json.dumps(so.json)
        return Structured(json=text, source=source)
    if so.structural_tag is not None:
        return Structured(structural_tag=so.structural_tag, source=source)
    if so.regex is not None:
        return Structured(regex=so.regex, source=source)
    if so.grammar is not None:
        return Structured(grammar=so.grammar, source=source)
    if so.choice is not None:
        return Structured(choice=tuple(so.choice), source=source)
    if so.json_object:
        return Structured(json_object=True, source=source)
    raise ParserConfigError(f"the tool parser asked for a constraint braid cannot pass on: {so!r}")


@attrs.define
class RequestParsers:
    parsers: Parsers
    request: Any
    """vLLM's ``ChatCompletionRequest`` for the parsers (its messages are not the request's)."""
    chat_template_kwargs: dict[str, Any]
    _adjusted: Any = None
    """vLLM's request after its parser's ``adjust_request`` (:meth:`constraint`)."""

    def constraint(self) -> Adjustment:
        """What vLLM's parser asks of the engine for this request (its ``adjust_request``):
        under ``"required"`` or a named function, and for some formats under ``"auto"``
        without parallel calls, a structured-output constraint that makes the model write a
        call (a structural tag, or a JSON schema); and whether special tokens must be kept
        in the text (a format whose markers are special tokens)."""
        p = self.parsers
        parser = p.cls(
            p.tokenizer, self.request.tools, chat_template_kwargs=self.chat_template_kwargs, model_config=None
        )
        adjusted = self._adjusted = parser.adjust_request(self.request.model_copy(deep=True))
        so = adjusted.structured_outputs
        return Adjustment(None if so is None else _structured(so), bool(adjusted.skip_special_tokens))

    def engine_reasoning(self, prompt_token_ids: Sequence[int]) -> tuple[bool | None, dict[str, Any] | None]:
        """``reasoning_ended`` and ``reasoning_parser_kwargs`` for the engine request of a prompt,
        as vLLM's serving layer sets them: ended when the reasoning is hidden, when the parser's
        own grammar handles it, or when the prompt ends it (the request's parser, with the
        request's template kwargs, says); the kwargs reach the engine's own reasoning parser."""
        p = self.parsers
        parser = p.cls(
            p.tokenizer, self.request.tools, chat_template_kwargs=self.chat_template_kwargs, model_config=None
        )
        request = self._adjusted if self._adjusted is not None else self.request
        ended = request.resolve_reasoning_ended(parser, list(prompt_token_ids))
        kwargs = None
        if parser.reasoning_parser is not None:
            kwargs = {"chat_template_kwargs": dict(self.chat_template_kwargs)}
        return ended, kwargs

    def choice(self, prompt_token_ids: Sequence[int]) -> VllmChoiceParser:
        p = self.parsers
        parser = p.cls(
            p.tokenizer, self.request.tools, chat_template_kwargs=self.chat_template_kwargs, model_config=None
        )
        return VllmChoiceParser(self, parser, list(prompt_token_ids))


@attrs.define
class VllmChoiceParser:
    """One choice's parser (:class:`braid.engine.tool_calls.ChoiceParser`)."""

    owner: RequestParsers
    parser: Any
    prompt_token_ids: list[int]
    _failed: bool = False
    _names_sent: set[int] = attrs.Factory(set)

    def feed(self, text: str, token_ids: Sequence[int], *, finished: bool) -> ParsedDelta:
        if self._failed:
            return ParsedDelta(content=text)
        try:
            message = self.parser.parse_delta(
                text, list(token_ids), self.owner.request, prompt_token_ids=self.prompt_token_ids, finished=finished
            )
        except Exception:  # a parser's bug must not end the stream: its text goes on as content
            log.exception("the tool/reasoning parser failed on a delta; the rest of the choice is content")
            self._failed = True
            return ParsedDelta(content=text)
        if message is None:
            return ParsedDelta()
        return ParsedDelta(
            content=message.content or "",
            reasoning=message.reasoning or "",
            tool_calls=tuple(self._pieces(message.tool_calls or ())),
        )

    def _pieces(self, calls: Sequence[Any]) -> list[ToolCallDelta]:
        out = []
        for call in calls:
            fn = call.function
            name = fn.name if fn is not None else None
            call_id = call.id
            if name and call.index not in self._names_sent:
                self._names_sent.add(call.index)
                call_id = call_id or make_tool_call_id()
            out.append(ToolCallDelta(call.index, call_id, name, (fn.arguments or "") if fn is not None else ""))
        return out

    def reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        try:
            return int(self.parser.count_reasoning_tokens(list(token_ids)))
        except Exception:  # a count is not worth a failed response
            log.exception("the reasoning parser failed to count reasoning tokens")
            return 0

    def parse(self, text: str, token_ids: Sequence[int]) -> ParsedOutput:
        try:
            self.parser.set_prompt_token_ids(self.prompt_token_ids)
            reasoning, content, calls = self.parser.parse(
                text,
                self.owner.request,
                enable_auto_tools=self.owner.parsers.options.enable_auto_tool_choice,
                model_output_token_ids=list(token_ids),
            )
        except Exception:  # as in feed(): the output stays, as content
            log.exception("the tool/reasoning parser failed on an output; it is returned as content")
            return ParsedOutput(content=text, reasoning=None)
        return ParsedOutput(
            content=content,
            reasoning=reasoning,
            tool_calls=tuple(ToolCall(c.id or make_tool_call_id(), c.name, c.arguments) for c in calls or ()),
        )


__all__ = [
    "Adjustment",
    "ParserConfigError",
    "ParserOptions",
    "check_parser_names",
    "Parsers",
    "RequestParsers",
    "VllmChoiceParser",
    "load_parsers",
    "reasoning_parser_names",
    "tool_parser_names",
]
