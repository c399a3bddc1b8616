"""The front end's options, with their defaults in one place.

:class:`Settings` is built once per app (``braid serve``'s flags, or a test's values) and passed
down whole: the view reads its limits from it, :mod:`braid.http.limits` the bounds on reading a
request, the run its buffer, stall timeout and heartbeat period. ``braid serve``'s flags take
their defaults from these fields (:mod:`braid.cli.fields`). A ground-floor module: it imports
nothing of braid's HTTP edge, which depends on it.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from braid.addresses import parse_allowed


def _strings(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _bearer_keys(_inst: object, _attr: object, keys: tuple[str, ...]) -> None:
    # Each key must fit in one "Authorization: Bearer <key>" header as it is compared there.
    for key in keys:
        if not key or not all("!" <= c <= "~" for c in key):
            raise ValueError("an API key must be non-empty visible ASCII without spaces")


@attrs.frozen
class ParserOptions:
    """Tool calling and reasoning: vLLM's server flags of the same names (issue 26).

    Names are checked against vLLM's registries before the engine starts, and the parsers loaded
    with the model's tokenizer when it has (:func:`braid.engine.vllm_parsers.load_parsers`).
    """

    enable_auto_tool_choice: bool = False
    """``tool_choice: "auto"`` (and tools without a ``tool_choice``) are parsed for calls."""
    tool_call_parser: str | None = None
    """vLLM's tool-call parser by its registered name (hermes, pythonic, ...)."""
    tool_parser_plugin: str | None = None
    """A module or file that registers more tool parsers: code the operator runs, never a request."""
    reasoning_parser: str | None = None
    """vLLM's reasoning parser by its registered name (qwen3, deepseek_r1, ...)."""
    exclude_tools_when_tool_choice_none: bool = False
    """With ``tool_choice: "none"`` the template is not given the tools."""

    @property
    def active(self) -> bool:
        return self.tool_call_parser is not None or self.reasoning_parser is not None


@attrs.frozen
class ServingOptions:
    """vLLM's server options that change what its routes answer (issue 29), under vLLM's flags;
    each off by default, as in vLLM (docs/compatibility.md, "Server options")."""

    tokenizer_info_endpoint: bool = False
    """``GET /tokenizer_info`` is served (a 404 otherwise): the tokenizer's configuration."""
    force_include_usage: bool = False
    """Every stream ends with a usage chunk and carries usage on every chunk, as with
    ``stream_options: {"include_usage": true, "continuous_usage_stats": true}``."""
    return_tokens_as_token_ids: bool = False
    """Logprobs name tokens as ``token_id:N`` when a request does not set its own
    ``return_tokens_as_token_ids``."""
    request_id_headers: bool = False
    """Every response carries ``X-Request-Id`` (braid.http.request_id)."""


@attrs.frozen
class Settings:
    max_prompts: int = attrs.field(default=1024, validator=attrs.validators.gt(0))
    """Prompts per request."""
    max_choices: int = attrs.field(default=4096, validator=attrs.validators.gt(0))
    """Prompts x n per request."""
    # Holds a full batch (1024 prompts) of 4000 token ids each at the widest, six digits and ", "
    # (tests/http/test_limits.py), about four times the default model's context. Longer contexts
    # at full batch need more; more also means more for braid to decode in memory per request.
    max_body_bytes: int = attrs.field(default=32 * 2**20, validator=attrs.validators.gt(0))
    """A larger request body is a 413, refused while it is read (braid.http.limits)."""
    # The largest body at 10 Mbit/s takes 27 s: a slow link is not a stalled client.
    body_timeout: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))
    """A request body not all there this many seconds after braid starts reading it is a 408."""
    # What h2 enforces on HTTP/2 whatever hypercorn is told, here for HTTP/1.1 too (hypercorn's
    # default there is 16 KiB), so one header block passes on both; long tokens and tracing
    # headers from gateways fit with room.
    max_header_bytes: int = attrs.field(default=64 * 2**10, validator=attrs.validators.gt(0))
    """An unfinished header block hypercorn buffers; past it, its 431 and the connection closes."""
    buffer: int = attrs.field(default=64, validator=attrs.validators.gt(0))
    """Outputs a run's channel holds before its drivers wait for the consumer."""
    # Both > 0: a heartbeat of 0 would make every stream's clock spin (braid.stream.heartbeat).
    stall_timeout: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))
    """A driver that cannot hand an output over for this long fails the run (the client stopped reading)."""
    heartbeat: float = attrs.field(default=15.0, validator=attrs.validators.gt(0))
    """An idle stream sends an SSE comment after this many seconds."""
    max_in_flight: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(0)))
    """Engine requests in the engine at once, server wide (``braid.stream.admit``); 0: unbounded; None:
    the engine's own running cap plus the reserve (``docs/admission.md``)."""
    max_queued: int = attrs.field(default=256, validator=attrs.validators.ge(0))
    """Requests that may wait for their first engine slot before new ones get a 429."""
    reserve: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(0)))
    """Slots kept for requests holding none; None: a sixteenth of the engine's running cap (at least 1)."""
    background_slots: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    """Engine slots the background class may hold at once (``docs/admission.md``); 0: every slot
    but the reserve, so background work alone runs the engine as full as a batch does."""
    handover_tokens: int = attrs.field(default=2, validator=attrs.validators.ge(0))
    """A prompt hands its engine slots to the next waiting prompt once at most this many of its
    ``max_tokens`` are left to generate (its end is then certain and near), so that the next
    request waits in the engine's queue as the slot frees, instead of the engine running a step
    without it (``docs/admission.md``); 0: only when its engine request has ended."""
    request_timeout: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.gt(0))
    )
    """Seconds from a request's arrival (queue wait included) after which its engine work is aborted."""
    prompt_tokens_details: bool = False
    """vLLM's --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens."""
    # Not in the repr, so that logging the settings never shows a key.
    api_keys: tuple[str, ...] = attrs.field(default=(), converter=_strings, validator=_bearer_keys, repr=False)
    """Bearer keys; when set, every request but GET /health needs one (braid.http.auth)."""
    background_keys: tuple[str, ...] = attrs.field(default=(), converter=_strings, validator=_bearer_keys, repr=False)
    """Keys (each one of ``api_keys`` too) whose every request is of the background class."""
    metrics_public: bool = False
    """With api_keys: GET /metrics is open too."""
    trust_request_chat_template: bool = False
    """A chat request may bring its own ``chat_template`` (jinja, rendered sandboxed): vLLM's flag."""
    allowed_origins: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    """CORS origins (or "*"); empty: no CORS headers at all (braid.http.cors)."""
    access_log: bool = False
    """One log line per HTTP request on the ``braid.access`` logger (braid.http.access_log)."""
    server_load_tracking: bool = False
    """vLLM's --enable-server-load-tracking: ``GET /load`` (and ``/get_load``, vllm-router's)
    report the generating requests open now (braid.routes.load); without it, 0."""
    runtime_lora_updating: bool = False
    """``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` are served (braid.routes.lora):
    ``--allow-runtime-lora-updating``, or vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``."""
    parsers: ParserOptions = attrs.Factory(ParserOptions)
    """Tool calling and reasoning (vLLM's flags)."""
    serving: ServingOptions = attrs.Factory(ServingOptions)
    """vLLM's server options of issue 29 (its routes' defaults and optional routes)."""
    forwarded_allow_ips: tuple[str, ...] = attrs.field(default=(), converter=parse_allowed)
    """Peers (IPs, networks, or "*") whose X-Forwarded-For/-Proto are trusted; empty: the headers
    are ignored (braid.http.forwarded)."""

    @property
    def open_paths(self) -> tuple[str, ...]:
        """The paths GET needs no key for when api_keys is set (each exact: braid.http.auth)."""
        return ("/health", "/metrics") if self.metrics_public else ("/health",)


__all__ = ["ParserOptions", "ServingOptions", "Settings"]
