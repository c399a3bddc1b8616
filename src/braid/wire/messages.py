"""Chat: messages -> one prompt text, rendered with the model's chat template.

Pure apart from the tokenizer's template call. :func:`parse_messages` turns one conversation of
the wire format into :class:`Message` values (text only: a text-only model refuses images and
audio with a 400), :func:`parse_tools` turns a request's ``tools`` into what the template gets,
and :func:`render` applies the chat template, as vLLM 0.32's server does before it tokenizes a
chat request: the template's output is a text, which is then tokenized like a completions prompt
(``add_special_tokens`` false by default for chat: the template writes the special tokens itself).

**What the template gets.** Each message is the dict vLLM's ``ConversationMessage`` is (its
``_parse_chat_message_content`` and ``_postprocess_messages``), keys in vLLM's order:

* ``role``, ``content``: always; the content is a text (vLLM's "string" content format): a list
  of parts is flattened to its text parts joined by newlines, no content is ``""``;
* an ``assistant`` message: ``tool_calls`` when it has a non-empty list of them, each
  ``{"id", "function": {"arguments", "name", ...}, "type": "function", ...}`` (the keys a client
  added kept, after the known ones, as pydantic keeps them) with ``arguments`` decoded from its JSON
  text to an object (``{}`` for empty, invalid or non-object JSON, as vLLM coerces it); then
  ``reasoning`` and ``reasoning_content``, the same value, when it has a reasoning;
* a ``tool`` message: ``tool_call_id`` when the message has the key (``None`` included);
* ``name`` and ``task`` when they are strings, for any role;
* a ``developer`` message: ``tools``, always (``None`` when it has none).

A system message's text parts that start with Claude Code's ``x-anthropic-billing-header`` line
lose that line (vLLM drops it: its value changes with every request and spoils the prefix cache).

**Which messages are refused, and where.** vLLM validates each message against a union of
pydantic message types (OpenAI's six, plus its own that takes any role); a message fails only if
no member takes it, and the 400 is located at the first member's first fault
(``body.messages.0.ChatCompletionDeveloperMessageParam.role``). So, as in vLLM, a user message's
``tool_calls`` are ignored, a ``tool`` message needs a string ``tool_call_id``, and a role vLLM
does not know must have well-typed ``tool_calls``, ``reasoning``, ``tool_call_id`` and ``task``.
An assistant message's tool calls are checked after the whole body (vLLM's "after" validator),
and located by the call's index alone (``body.0.ChatCompletionMessageFunctionToolCallParam.id``:
vLLM's location, which names neither the message nor ``arguments``). The three requests that
carry messages validate them differently in vLLM (:data:`RequestModel`); ``parse_messages`` follows
the one it is told.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs

from braid.engine.base import Tokenizer
from braid.errors import InvalidRequest, SchemaError

TEXT_PART_TYPES = frozenset({"text", "input_text"})
"""Content part types that carry text; any other part is content a text-only model cannot take."""

RequestModel = Literal["chat", "batch", "tokenize"]
"""Which of vLLM's request models the messages came in, as each validates them its own way:

* ``chat`` (``ChatCompletionRequest``): ``reasoning_content`` is renamed ``reasoning``; a
  ``tool_calls`` that is not a list is made one first (a string's characters, an object's keys;
  a number is a 400 of type ``BadRequestError``); tool calls are checked after the whole body, a
  ``Bad Request`` at the call's location.
* ``batch`` (``BatchChatCompletionRequest``): each message is checked as it was sent, then again
  as a ``chat`` message when vLLM builds the conversation's own request; what fails only then, and
  every bad tool call, is a ``BadRequestError`` with no ``param``.
* ``tokenize`` (``TokenizeChatRequest``): no renaming (``reasoning_content`` is ignored); a bad
  tool call is found while rendering: :class:`RenderTimeError`, which the view raises after its
  own checks (the model's name first).
"""

_DEVELOPER = "ChatCompletionDeveloperMessageParam"
_FUNCTION_CALL = "ChatCompletionMessageFunctionToolCallParam"
_BILLING_HEADER = "x-anthropic-billing-header"
_NOT_FUNCTION = "chat completions only support assistant tool_calls of type 'function'."


class RenderTimeError(InvalidRequest):
    """A 400 (``BadRequestError``) that vLLM finds only when it renders the conversation, after
    the request's other checks: a caller that checks more (the ``/tokenize`` view: the model's
    name, the template) raises it after those, to answer what vLLM answers to a body with several
    faults."""


class _Absent(enum.Enum):
    ABSENT = "absent"


ABSENT = _Absent.ABSENT
"""A key the message did not have (where that differs from the key with ``None``)."""

Pairs = tuple[tuple[str, Any], ...]


@attrs.frozen
class MessageToolCall:
    """A call of a function tool in an assistant message of the conversation (history), as the
    template gets it (:meth:`as_template_input`)."""

    id: str
    name: str
    arguments: Mapping[str, Any]
    """The ``arguments`` JSON text decoded; ``{}`` when it was empty, invalid or not an object."""
    extra: Pairs = ()
    """The call's other keys, in the order sent (vLLM keeps them)."""
    function_extra: Pairs = ()
    """The other keys of its ``function``, in the order sent."""
    chars: int = 0
    """The length of the ``arguments`` text as sent (a measure of the template's work)."""

    def as_template_input(self) -> dict[str, Any]:
        function = {"arguments": self.arguments, "name": self.name, **dict(self.function_extra)}
        return {"id": self.id, "function": function, "type": "function", **dict(self.extra)}


@attrs.frozen
class Message:
    """One message of a conversation; :meth:`as_template_input` is the dict the template gets
    (see the module docstring for which keys each role has)."""

    role: str
    content: str | None
    """The text (parts joined by newlines); None for a message without content."""
    name: str | None = None
    tool_calls: tuple[MessageToolCall, ...] | None = None
    """An assistant message's calls; None when it has none (an empty list is none, as in vLLM)."""
    tool_call_id: str | None | _Absent = ABSENT
    """A tool message's ``tool_call_id``: the string, None when sent as null, else ABSENT."""
    reasoning: Any = None
    """An assistant message's ``reasoning`` (or ``reasoning_content``), as sent: vLLM checks no type."""
    task: str | None = None
    tools: Any = None
    """A developer message's ``tools`` (vLLM's own message type): what vLLM hands the template."""

    @property
    def chars(self) -> int:
        """About how much text the template works through for this message."""
        calls = sum(len(c.name) + c.chars for c in self.tool_calls or ())
        return len(self.content or "") + calls + (len(self.reasoning) if isinstance(self.reasoning, str) else 0)

    def as_template_input(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content if self.content is not None else ""}
        if self.role == "assistant":
            if self.tool_calls:
                out["tool_calls"] = [c.as_template_input() for c in self.tool_calls]
            if self.reasoning is not None:
                out["reasoning"] = out["reasoning_content"] = self.reasoning
        elif self.role == "tool" and self.tool_call_id is not ABSENT:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        if self.task is not None:
            out["task"] = self.task
        if self.role == "developer":
            out["tools"] = self.tools
        return out


@attrs.frozen
class TemplateOptions:
    """How a conversation is rendered: vLLM's request fields of the same names."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    """A request's own template (only when the server allows it: ``--trust-request-chat-template``)."""
    kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    """``chat_template_kwargs`` (and ``documents``), passed to the template as variables; a value
    of None or ``"auto"`` is left out, and a ``tools`` here wins over :attr:`tools` (vLLM merges
    the request's kwargs over its own this way)."""
    tools: tuple[Mapping[str, Any], ...] | None = None
    """The request's ``tools`` as the template gets them (:func:`parse_tools`); None for none,
    which the caller also decides when ``tool_choice`` is ``"none"`` and the server excludes them."""

    def __attrs_post_init__(self) -> None:
        if self.add_generation_prompt and self.continue_final_message:
            raise InvalidRequest(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            )


# -- tools


def parse_tools(value: object) -> tuple[dict[str, Any], ...] | None:
    """A request's ``tools`` as vLLM hands them to the template: each its
    ``ChatCompletionToolsParam.model_dump()``, ``{"type": "function", "function": {"name",
    "description", "parameters"[, "strict"][, "defer_loading"]}[, "defer_loading"]}`` (the
    description and parameters even when null; a tool's ``defer_loading`` copied into its
    function's when that has none; other keys dropped). None for None; ``[]`` gives ``()``
    (the caller refuses it, as vLLM does, or not).

    A value of the wrong type is a :class:`~braid.errors.SchemaError` at pydantic's location,
    the first fault in vLLM's field order (``body.tools.0.function.name``). Types are strict (vLLM's
    pydantic takes ``"true"`` for a boolean)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise SchemaError("`tools` must be a list of function tools.", param="body.tools")
    return tuple(_tool(t, f"body.tools.{i}") for i, t in enumerate(value))


def _optional(d: Mapping[str, Any], key: str, kind: type) -> bool:
    """``d[key]`` is absent, null or a ``kind``."""
    v = d.get(key)
    return v is None or isinstance(v, kind)


def _tool(t: object, loc: str) -> dict[str, Any]:
    def bad(where: str, what: str) -> SchemaError:
        return SchemaError(f"{loc.removeprefix('body.')}{where} {what}", param=loc + where)

    if not isinstance(t, dict):
        raise bad("", "must be a function tool object.")
    if "type" in t and t["type"] != "function":
        raise bad(".type", 'must be "function".')
    f = t.get("function")
    if not isinstance(f, dict):
        raise bad(".function", "must be an object with the function's name.")
    if not isinstance(f.get("name"), str):
        raise bad(".function.name", "must be a string.")
    for key, kind, what in (
        ("description", str, "a string"),
        ("parameters", dict, "an object (a JSON schema)"),
        ("strict", bool, "a boolean"),
        ("defer_loading", bool, "a boolean"),
    ):
        if not _optional(f, key, kind):
            raise bad(f".function.{key}", f"must be {what} or null.")
    if not _optional(t, "defer_loading", bool):
        raise bad(".defer_loading", "must be a boolean or null.")
    function: dict[str, Any] = {
        "name": f["name"],
        "description": f.get("description"),
        "parameters": f.get("parameters"),
    }
    if f.get("strict") is not None:
        function["strict"] = f["strict"]
    defer = t.get("defer_loading")
    f_defer = f.get("defer_loading")
    if f_defer is None:
        f_defer = defer  # vLLM copies the tool's flag into its function's
    if f_defer is not None:
        function["defer_loading"] = f_defer
    tool: dict[str, Any] = {"type": "function", "function": function}
    if defer is not None:
        tool["defer_loading"] = defer
    return tool


# -- messages


def _is_str(v: object) -> bool:
    return isinstance(v, str)


def _absent_or(m: Mapping[str, Any], key: str, ok: Callable[[Any], bool]) -> bool:
    return key not in m or ok(m[key])


def _null_or(m: Mapping[str, Any], key: str, ok: Callable[[Any], bool]) -> bool:
    return m.get(key) is None or ok(m[key])


def _function_call_fault(item: object) -> str | None:
    """Where an item fails OpenAI's function tool call type (the suffix of its location, "" for
    the item itself), or None when it is one. vLLM's location drops ``arguments``: pydantic-core
    names the field as it names one of its own validator kinds."""
    if not isinstance(item, dict):
        return ""
    if not isinstance(item.get("id"), str):
        return ".id"
    f = item.get("function")
    if not isinstance(f, dict) or not isinstance(f.get("arguments"), str):
        return ".function"
    if not isinstance(f.get("name"), str):
        return ".function.name"
    if item.get("type") != "function":
        return ".type"
    return None


def _is_custom_call(item: object) -> bool:
    """OpenAI's custom tool call: a valid call that vLLM's chat refuses only when it renders."""
    if not isinstance(item, dict) or not isinstance(item.get("id"), str) or item.get("type") != "custom":
        return False
    c = item.get("custom")
    return isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("input"), str)


def _is_function_tool(t: object) -> bool:
    """OpenAI's ``ChatCompletionFunctionToolParam`` (a developer message's tools, vLLM's own type)."""
    if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
        return False
    f = t["function"]
    return (
        isinstance(f.get("name"), str)
        and _absent_or(f, "description", _is_str)
        and _absent_or(f, "parameters", lambda p: isinstance(p, dict))
        and _null_or(f, "strict", lambda s: isinstance(s, bool))
    )


def _typed_dict(d: Mapping[str, Any], known: Sequence[str]) -> dict[str, Any]:
    """``d`` as pydantic validates a TypedDict that keeps extra keys: its known keys in their
    declared order, then the others in the order sent."""
    return {**{k: d[k] for k in known if k in d}, **{k: v for k, v in d.items() if k not in known}}


def _developer_tools(tools: list[Any]) -> list[dict[str, Any]]:
    fields = ("name", "description", "parameters", "strict")
    return [{**_typed_dict(t, ("function", "type")), "function": _typed_dict(t["function"], fields)} for t in tools]


def _custom_member_takes(m: Mapping[str, Any]) -> bool:
    """vLLM's own message type (any role) takes ``m``: its typed fields are well typed."""
    return (
        _absent_or(m, "content", lambda c: isinstance(c, (str, list)))
        and _absent_or(m, "name", _is_str)
        and _null_or(m, "tool_call_id", _is_str)
        and _null_or(m, "tool_calls", lambda v: isinstance(v, list) and all(_function_call_fault(i) is None for i in v))
        and _null_or(m, "reasoning", _is_str)
        and _null_or(m, "tools", lambda v: isinstance(v, list) and all(map(_is_function_tool, v)))
        and _null_or(m, "task", _is_str)
    )


def _openai_member_takes(m: Mapping[str, Any]) -> bool:
    """One of OpenAI's six message types takes ``m`` (each ignores the keys it does not declare)."""
    role, content = m["role"], m.get("content")
    name_ok = _absent_or(m, "name", _is_str)
    if role in ("developer", "system", "user"):
        return isinstance(content, (str, list)) and name_ok
    if role == "assistant":
        return (
            (content is None or isinstance(content, (str, list)))
            and name_ok
            # an Iterable: validated item by item later, when vLLM lists it
            and _absent_or(m, "tool_calls", lambda v: isinstance(v, (list, str, dict)))
            and _null_or(m, "audio", lambda a: isinstance(a, dict) and _is_str(a.get("id")))
            and _null_or(
                m,
                "function_call",
                lambda f: isinstance(f, dict) and _is_str(f.get("name")) and _is_str(f.get("arguments")),
            )
            and _null_or(m, "refusal", _is_str)
        )
    if role == "tool":
        return isinstance(content, (str, list)) and _is_str(m.get("tool_call_id"))
    if role == "function":
        return "content" in m and (content is None or isinstance(content, str)) and _is_str(m.get("name"))
    return False


def _union_fault(m: Mapping[str, Any]) -> str | None:
    """None when a member of vLLM's message union takes ``m``; else the field of the first
    member's (the developer message's) first fault, which is where vLLM locates the 400."""
    if _openai_member_takes(m) or _custom_member_takes(m):
        return None
    if not isinstance(m.get("content"), (str, list, dict)):  # dict: an Iterable to pydantic
        return "content"
    if m["role"] != "developer":
        return "role"
    return "name"


def _listed(value: object, at: str) -> object:
    """vLLM's chat request lists a ``tool_calls`` that is not a list before anything else
    (``list(value)``: a string's characters, an object's keys); a number cannot be listed."""
    if value is None or isinstance(value, list):
        return value
    if isinstance(value, (str, dict)):
        return list(value)
    raise InvalidRequest(f"{at}.tool_calls: '{type(value).__name__}' object is not iterable")


def _arguments(text: str, at: str) -> dict[str, Any]:
    """vLLM's ``_postprocess_messages``: the JSON text decoded; an empty text, invalid JSON or a
    value that is not an object is ``{}`` (a bad call in the history must not fail every later
    turn of the conversation). Decoded by Python's json, as vLLM does (NaN, big integers)."""
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return {}
    except (ValueError, RecursionError):
        # an integer of more digits than Python converts: vLLM's 400. Nesting deeper than the
        # recursion limit: vLLM answers 500; braid refuses the request instead.
        raise RenderTimeError(f"{at}.function.arguments cannot be decoded.", param=None) from None
    return parsed if isinstance(parsed, dict) else {}


def _call_faults(value: list[Any], at: str, loc: str | None) -> None:
    """Each call checked against OpenAI's call types, in order, as pydantic lists them: a fault is
    a :class:`SchemaError` at ``loc`` + the call's location when ``loc`` is given (the chat route),
    else a :class:`RenderTimeError` with no param."""
    for k, item in enumerate(value):
        fault = _function_call_fault(item)
        if fault is not None and not _is_custom_call(item):
            message = (
                f"{at}.tool_calls[{k}] is not a function tool call "
                f"({{id, type: 'function', function: {{name, arguments}}}}); the fault is at {fault or 'the call'}."
            )
            if loc is not None:
                raise SchemaError(message, param=f"{loc}.{k}.{_FUNCTION_CALL}{fault}")
            raise RenderTimeError(message, param=None)


def _tool_calls(value: list[Any], at: str) -> tuple[MessageToolCall, ...] | None:
    """Valid calls (:func:`_call_faults`) as the template gets them: vLLM's renderer refuses a
    custom tool call, and decodes each function call's arguments."""
    if not value:
        return None  # vLLM drops an empty list: the template takes the message's plain path
    calls = []
    for k, item in enumerate(value):
        if _is_custom_call(item):
            raise RenderTimeError(_NOT_FUNCTION, param="tool_calls")
        f = item["function"]
        calls.append(
            MessageToolCall(
                id=item["id"],
                name=f["name"],
                arguments=_arguments(f["arguments"], f"{at}.tool_calls[{k}]"),
                extra=tuple((key, v) for key, v in item.items() if key not in ("id", "function", "type")),
                function_extra=tuple((key, v) for key, v in f.items() if key not in ("arguments", "name")),
                chars=len(f["arguments"]),
            )
        )
    return tuple(calls)


def _strip_billing_header(texts: list[str]) -> list[str]:
    out = []
    for text in texts:
        if text.startswith(_BILLING_HEADER):
            text = text.partition("\n")[2]
            if not text:
                continue
        out.append(text)
    return out


def _content(value: object, where: str, role: str) -> str | None:
    if value is None or (isinstance(value, str) and role != "system"):
        return value
    if isinstance(value, str):
        return "\n".join(_strip_billing_header([value]))
    if not isinstance(value, list):
        raise SchemaError(f"{where}.content must be a string or a list of content parts.", param=f"{where}.content")
    texts = []
    for j, part in enumerate(value):
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise SchemaError(f"{where}.content[{j}] must be a content part object with a type.")
        kind = part["type"]
        if kind not in TEXT_PART_TYPES:
            raise InvalidRequest(
                f"{where}.content[{j}] has type {kind!r}: this model takes text only "
                "(images, audio, video and files need a multimodal model)."
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise SchemaError(f"{where}.content[{j}].text must be a string.")
        texts.append(text)
    return "\n".join(_strip_billing_header(texts) if role == "system" else texts)


def _renamed(m: dict[str, Any], at: str) -> dict[str, Any]:
    """``m`` as vLLM's chat request's "before" validator leaves it: a ``tool_calls`` that is not a
    list listed (:func:`_listed`), ``reasoning_content`` renamed ``reasoning`` (which wins when
    both are set)."""
    m = dict(m)
    if "tool_calls" in m:
        m["tool_calls"] = _listed(m["tool_calls"], at)
    rc = m.pop("reasoning_content", None)
    if rc is not None and m.get("reasoning") is None:
        m["reasoning"] = rc
    return m


def _location(where: str) -> str:
    """``messages[1]`` as pydantic names it: ``body.messages.1``."""
    return "body." + where.replace("[", ".").replace("]", "")


def _union_error(where: str, i: int, loc: str, fault: str) -> SchemaError:
    return SchemaError(
        f"{where}[{i}] is not a message vLLM takes: no message type accepts its fields "
        "(check the types of content, name, tool_call_id, tool_calls, reasoning and task).",
        param=f"{loc}.{fault}",
    )


def parse_messages(value: object, where: str = "messages", *, model: RequestModel | None = None) -> tuple[Message, ...]:
    """One conversation of the wire format; a 400 (:class:`InvalidRequest`, or its
    :class:`SchemaError` at pydantic's location) for what vLLM refuses, and not for what it takes.
    The checks run in vLLM's order: every message's type, then every tool call, then the content
    parts and what vLLM checks as it renders (:class:`RenderTimeError`).

    ``where``: the conversation's place in the body (``messages``; ``messages[1]`` for the second
    conversation of a batch), for the errors' text and location. ``model``: which request the
    conversation came in (:data:`RequestModel`); by default ``batch`` when ``where`` indexes a
    conversation, else ``chat``."""
    if model is None:
        model = "batch" if where.startswith("messages[") else "chat"
    base = _location(where)
    if not isinstance(value, list):
        raise SchemaError(f"{where} must be a list of messages.", param=base)
    if not value:
        raise InvalidRequest(f"{where} must hold at least one message.")
    raw: list[dict[str, Any]] = []
    for i, m in enumerate(value):
        loc = f"{base}.{i}.{_DEVELOPER}"
        if not isinstance(m, dict):
            raise SchemaError(f"{where}[{i}] must be a message object.", param=loc)
        if not isinstance(m.get("role"), str) or not m["role"]:
            # pydantic checks the developer message's content before its role
            field = "role" if isinstance(m.get("content"), (str, list, dict)) else "content"
            raise SchemaError(f"{where}[{i}].role must be a non-empty string.", param=f"{loc}.{field}")
        raw.append(m)
    if model == "chat":
        raw = [_renamed(m, f"{where}[{i}]") for i, m in enumerate(raw)]  # before any message is validated
    for i, m in enumerate(raw):
        if (fault := _union_fault(m)) is not None:
            raise _union_error(where, i, f"{base}.{i}.{_DEVELOPER}", fault)
    if model == "batch":
        # vLLM then builds each conversation's own chat request, which validates them again
        for i, m in enumerate(raw):
            at = f"{where}[{i}]"
            try:
                raw[i] = _renamed(m, at)
            except InvalidRequest as exc:
                raise RenderTimeError(exc.message) from None
            if _union_fault(raw[i]) is not None:
                raise RenderTimeError(f"{at} is not a message vLLM takes in a chat request.")
    listed: dict[int, list[Any]] = {}
    for i, m in enumerate(raw):
        calls = m.get("tool_calls")
        if m["role"] == "assistant" and calls is not None:
            # an Iterable to pydantic (a string's characters, an object's keys), listed after the body
            listed[i] = calls if isinstance(calls, list) else list(calls)
            _call_faults(listed[i], f"{where}[{i}]", "body" if model == "chat" else None)
    contents = [_content(m.get("content"), f"{where}[{i}]", m["role"]) for i, m in enumerate(raw)]
    out = []
    for i, m in enumerate(raw):
        role = m["role"]
        tools = m.get("tools")
        if role == "developer" and isinstance(tools, list) and _custom_member_takes(m):
            tools = _developer_tools(tools)  # vLLM's own message type took it: that type's key order
        out.append(
            Message(
                role,
                contents[i],
                name=m["name"] if isinstance(m.get("name"), str) else None,
                tool_calls=_tool_calls(listed[i], f"{where}[{i}]") if i in listed else None,
                tool_call_id=m["tool_call_id"] if role == "tool" and "tool_call_id" in m else ABSENT,
                reasoning=m.get("reasoning") if role == "assistant" else None,
                task=m["task"] if isinstance(m.get("task"), str) else None,
                tools=tools if role == "developer" else None,
            )
        )
    return tuple(out)


def response_role(messages: Sequence[Message], options: TemplateOptions) -> str:
    """The role of the reply: ``assistant`` after a generation prompt, else the last message's
    (a continued message keeps its role), as vLLM's server decides it."""
    return "assistant" if options.add_generation_prompt else messages[-1].role


def echo_text(messages: Sequence[Message], role: str) -> str:
    """What ``echo`` puts before the reply: the last message's content when it has the reply's role."""
    last = messages[-1]
    return last.content or "" if last.role == role else ""


def template_kwargs(options: TemplateOptions) -> tuple[dict[str, Any], list[Mapping[str, Any]] | None]:
    """The template's variables and its ``tools``, as vLLM merges them: the request's kwargs
    without their None and ``"auto"`` values, and a ``tools`` among them wins over the request's."""
    kwargs = {k: v for k, v in options.kwargs.items() if v is not None and not (isinstance(v, str) and v == "auto")}
    tools = kwargs.pop("tools", None)
    if tools is None and options.tools is not None:
        tools = list(options.tools)
    return kwargs, tools


def render(tokenizer: Tokenizer, messages: Sequence[Message], options: TemplateOptions) -> str:
    """The conversation as the model's chat template writes it. A model without a template, or a
    template that fails on this conversation, is a 400 (never a guess at a format): for a failing
    template, vLLM's (``BadRequestError`` with the template's reason, no ``param``)."""
    kwargs, tools = template_kwargs(options)
    try:
        return tokenizer.apply_chat_template(
            [m.as_template_input() for m in messages],
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
            chat_template=options.chat_template,
            template_kwargs=kwargs,
            tools=tools,
        )
    except InvalidRequest:
        raise
    except Exception as exc:  # noqa: BLE001  # jinja's and the tokenizer's errors: the request's template input
        raise InvalidRequest(f"The chat template could not be applied: {exc}") from None


def check_template_trusted(chat_template: object, kwargs: Mapping[str, Any] | None, *, trust: bool) -> None:
    """A request's own template (``chat_template``, or one in ``chat_template_kwargs``) is refused,
    in vLLM's words, unless the server has ``--trust-request-chat-template``."""
    if trust or (chat_template is None and (kwargs or {}).get("chat_template") is None):
        return
    raise InvalidRequest(
        "Chat template is passed with request, but --trust-request-chat-template is not set. "
        "Refused request with untrusted chat template."
    )


__all__ = [
    "ABSENT",
    "Message",
    "MessageToolCall",
    "RenderTimeError",
    "RequestModel",
    "TemplateOptions",
    "check_template_trusted",
    "echo_text",
    "parse_messages",
    "parse_tools",
    "render",
    "response_role",
    "template_kwargs",
]
