"""``braid``'s command line: the sub-commands and their options, declared once.

Every option that fills a field of ``Settings``, ``ServerConfig`` or
:class:`~braid.cli.engines.EngineOptions` is declared with
:func:`~braid.cli.fields.add_field_option`: its value lands under the field's name and its
default is the field's, so no default is restated here. :mod:`braid.cli.config` builds those
classes from the parsed arguments. Every option can also come from a ``BRAID_*`` variable, and
``--help`` shows each option's default and variable (:mod:`braid.cli.environ`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from braid.cli.argtypes import allowed_peers, engine_arg, json_object, key_file, lora_module, positive, positive_int
from braid.cli.engines import ENGINE_CLIENTS, ENGINE_KINDS, EngineOptions
from braid.cli.environ import API_KEY_ENV, apply_env_defaults
from braid.cli.fields import add_field_option, field_default
from braid.logs import LOG_FORMATS
from braid.settings import ParserOptions, ServingOptions, Settings
from braid.store.options import StoreOptions


def build_parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """``braid``'s parser. With ``env`` (``main`` passes ``os.environ``), every ``serve`` option
    ``--some-flag`` takes its default from ``BRAID_SOME_FLAG`` when that is set."""
    parser = argparse.ArgumentParser(prog="braid", description="Batched OpenAI-compatible completions on Trio.")
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve(commands, env)
    # Listed for `braid -h`; braid.cli.main hands `braid batch ...` to braid.cli.batch's own parser.
    commands.add_parser("batch", help="run a batch file offline: braid batch -i IN -o OUT [serve options]")
    return parser


def add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser], env: Mapping[str, str] | None) -> None:
    """The ``serve`` sub-command: the engine's options, then the front end's and the server's."""
    from braid.http.server import ServerConfig  # imports quart: never at module level (braid.cli.main)

    s = commands.add_parser("serve", help="serve the OpenAI-compatible API")
    add_field_option(s, ServerConfig, "host", "--host")
    add_field_option(s, ServerConfig, "port", "--port", type=int)
    add_engine_options(s)

    add_front_end_options(s)
    add_access_options(s)
    add_parser_options(s)
    add_serving_options(s)
    add_log_options(s)
    add_admission_options(s)
    add_storage_options(s)
    apply_env_defaults(s, env)


def add_front_end_options(parser: argparse.ArgumentParser) -> None:
    """The front end's limits and timeouts (:class:`~braid.settings.Settings`, the server's config)."""
    from braid.http.server import ServerConfig  # imports quart: never at module level (braid.cli.main)

    h = parser.add_argument_group("front end")
    add_field_option(h, Settings, "max_prompts", "--max-prompts", type=int, help="prompts per request")
    add_field_option(h, Settings, "max_choices", "--max-choices", type=int, help="prompts x n per request")
    add_field_option(
        h,
        Settings,
        "max_body_bytes",
        "--max-body-bytes",
        type=positive_int,
        help="413 for a larger request body, refused as it is read (declared or sent)",
    )
    add_field_option(
        h,
        Settings,
        "body_timeout",
        "--body-timeout",
        type=positive,
        help="408 for a request body not all received this many seconds after braid starts reading it",
    )
    add_field_option(
        h,
        Settings,
        "max_header_bytes",
        "--max-header-bytes",
        type=positive_int,
        help="hypercorn's 431 for a larger unfinished request header block (HTTP/1.1; HTTP/2 keeps h2's 64 KiB)",
    )
    add_field_option(
        h,
        Settings,
        "stall_timeout",
        "--stall-timeout",
        type=positive,
        help="abort a stream when its client has taken none of braid's output for this long "
        "(seconds): the engine's buffer for the stream stayed full, so a reader too slow to take "
        f"one chunk (up to {field_default(Settings, 'buffer')} events) in this time is cut",
    )
    add_field_option(
        h, Settings, "heartbeat", "--heartbeat", type=positive, help="SSE comment after this many idle seconds"
    )
    add_field_option(
        h,
        Settings,
        "prompt_tokens_details",
        "--enable-prompt-tokens-details",
        action="store_true",
        help="usage reports prompt_tokens_details.cached_tokens: the prompt tokens found in the "
        "engine's prefix cache, summed over a batch's prompts",
    )
    add_field_option(
        h,
        ServerConfig,
        "graceful_timeout",
        "--graceful-timeout",
        type=float,
        help="drain time after SIGTERM (seconds)",
    )
    # Not the field's default: unless given, the connection's timeout is the stall timeout given.
    h.add_argument(
        "--write-timeout",
        type=positive,
        default=None,
        metavar="SECONDS",
        help="reset a connection whose client takes less than 16 KiB of a response in this long "
        "(braid.http.patches.write_deadline); default: the stall timeout",
    )
    add_field_option(
        h, ServerConfig, "backlog", "--backlog", type=int, help="listen queue length (capped by net.core.somaxconn)"
    )
    add_field_option(
        h,
        ServerConfig,
        "accept_batch",
        "--accept-batch",
        type=int,
        help="connections one turn of the accept loop takes (braid.http.patches.accept); 1: trio's own, "
        "one per scheduler round (for comparison)",
    )
    add_field_option(
        h,
        ServerConfig,
        "keep_alive_timeout",
        "--keep-alive",
        type=float,
        help="idle keep-alive timeout (seconds)",
    )
    add_field_option(
        h,
        EngineOptions,
        "switch_interval",
        "--switch-interval",
        type=float,
        metavar="SECONDS",
        help="how long a thread may hold the GIL while another waits for it (sys.setswitchinterval); "
        "default 0.001 with --engine-client asyncio, whose output handler runs on a second thread, "
        "Python's 0.005 otherwise",
    )
    h.add_argument(
        "--stock-send",
        action="store_true",
        help="send every response chunk through hypercorn's own locked path, not braid's "
        "direct socket write (see braid.http.patches.fast_send; for comparison)",
    )


def add_access_options(parser: argparse.ArgumentParser) -> None:
    """Who may call which route: API keys and CORS (:mod:`braid.http.auth`, :mod:`braid.http.cors`)."""
    k = parser.add_argument_group("access (braid.http.auth, braid.http.cors)")
    k.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help=f"require 'Authorization: Bearer KEY' on every route but GET /health (repeatable; "
        f"visible in ps: prefer --api-key-file or {API_KEY_ENV})",
    )
    k.add_argument(
        "--api-key-file",
        type=key_file,
        action="append",
        default=[],
        metavar="PATH",
        help="API keys, one per line; blank lines and lines starting with # are skipped (repeatable)",
    )
    k.add_argument(
        "--background-api-key-file",
        type=key_file,
        action="append",
        default=[],
        metavar="PATH",
        help="API keys whose every request runs in the background class (docs/admission.md), one per "
        "line like --api-key-file; they are valid keys too (repeatable)",
    )
    add_field_option(
        k,
        Settings,
        "metrics_public",
        "--metrics-public",
        action="store_true",
        help="with API keys: leave GET /metrics open",
    )
    add_field_option(
        k,
        Settings,
        "trust_request_chat_template",
        "--trust-request-chat-template",
        action="store_true",
        help="let a chat request bring its own chat_template (jinja, rendered sandboxed), as vLLM's flag",
    )
    add_field_option(
        k,
        Settings,
        "allowed_origins",
        "--allowed-origins",
        action="append",
        metavar="ORIGIN",
        help="enable CORS for this origin, e.g. https://app.example, or * for any (repeatable; default: no CORS)",
    )


def add_parser_options(parser: argparse.ArgumentParser) -> None:
    """vLLM's tool-call and reasoning flags (:class:`~braid.settings.ParserOptions`)."""
    t = parser.add_argument_group("tool calling and reasoning, as vLLM's flags (docs/compatibility.md)")
    add_field_option(
        t,
        ParserOptions,
        "enable_auto_tool_choice",
        "--enable-auto-tool-choice",
        action="store_true",
        help='parse tool calls from the output when tool_choice is "auto" (needs --tool-call-parser)',
    )
    add_field_option(
        t,
        ParserOptions,
        "tool_call_parser",
        "--tool-call-parser",
        metavar="NAME",
        help="vLLM's tool-call parser for the model's format, e.g. hermes, pythonic, llama3_json",
    )
    add_field_option(
        t,
        ParserOptions,
        "tool_parser_plugin",
        "--tool-parser-plugin",
        metavar="PATH",
        help="a Python module or file that registers more tool parsers (runs its code at start-up)",
    )
    add_field_option(
        t,
        ParserOptions,
        "reasoning_parser",
        "--reasoning-parser",
        metavar="NAME",
        help="vLLM's reasoning parser, e.g. qwen3, deepseek_r1: the thinking goes to the reasoning field",
    )
    add_field_option(
        t,
        ParserOptions,
        "exclude_tools_when_tool_choice_none",
        "--exclude-tools-when-tool-choice-none",
        action="store_true",
        help='with tool_choice "none", do not show the tools to the chat template',
    )


def add_log_options(parser: argparse.ArgumentParser) -> None:
    """Logs and the proxies braid trusts (:mod:`braid.logs`, :mod:`braid.http.access_log`)."""
    g = parser.add_argument_group("logs (braid.logs, braid.http.access_log)")
    g.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text: readable lines; json: one JSON object per line (time, level, logger, message, "
        "exception), for a log agent",
    )
    add_field_option(
        g,
        Settings,
        "access_log",
        "--access-log",
        action="store_true",
        help="one line per HTTP request on stdout: remote address, method, path, status, bytes, "
        "duration, request id, user agent (the rest of the log goes to stderr)",
    )
    add_field_option(
        g,
        Settings,
        "forwarded_allow_ips",
        "--forwarded-allow-ips",
        type=allowed_peers,
        metavar="IPS",
        help="comma-separated addresses or networks of proxies whose X-Forwarded-For and "
        "X-Forwarded-Proto braid trusts, or * for any peer; other peers' are ignored",
    )


def add_admission_options(parser: argparse.ArgumentParser) -> None:
    """Admission: slots, the queue, the classes, timeouts (docs/admission.md)."""
    a = parser.add_argument_group("admission (docs/admission.md)")
    add_field_option(
        a,
        Settings,
        "server_load_tracking",
        "--enable-server-load-tracking",
        action="store_true",
        help="vLLM's flag: GET /load (and /get_load, which vllm-router polls) report the generating "
        "requests open now, queued ones included (docs/deploy.md); without it they report 0",
    )
    add_field_option(
        a,
        Settings,
        "max_in_flight",
        "--max-in-flight-requests",
        type=int,
        metavar="N",
        help="engine requests in the engine at once, server wide; a prompt with n choices takes n "
        "(none: the engine's own running cap, vLLM's max_num_seqs plus the reserve; 0: unbounded)",
    )
    add_field_option(
        a,
        Settings,
        "max_queued",
        "--max-queued-requests",
        type=int,
        metavar="Q",
        help="requests that may wait for their first engine slot; more get 429 with Retry-After",
    )
    add_field_option(
        a,
        Settings,
        "background_slots",
        "--batch-max-slots",
        type=int,
        metavar="B",
        help="engine slots the background class (service_tier flex, background keys) may hold at once; "
        "it takes only slots no interactive request waits for (0: every slot but the reserve)",
    )
    add_field_option(
        a,
        Settings,
        "handover_tokens",
        "--handover-tokens",
        type=int,
        metavar="T",
        help="a prompt hands its engine slots on to the next waiting prompt when at most T of its "
        "max_tokens are left, so the engine never runs a step short of the next request "
        "(0: when its engine request has ended)",
    )
    add_field_option(
        a,
        Settings,
        "reserve",
        "--admission-reserve",
        type=int,
        metavar="R",
        help="engine slots kept for requests holding none, so a newcomer starts at the engine's "
        "next step while a large batch runs; with vLLM the engine's running cap is raised by R "
        "(none: a sixteenth of max_num_seqs, at least 1)",
    )
    add_field_option(
        a,
        Settings,
        "request_timeout",
        "--request-timeout",
        type=positive,
        metavar="SECONDS",
        help="abort a request this long after it arrived, queue wait included",
    )


def add_serving_options(parser: argparse.ArgumentParser) -> None:
    """vLLM's server options of :class:`~braid.settings.ServingOptions`, under vLLM's flags."""
    v = parser.add_argument_group('vLLM\'s server options (docs/compatibility.md, "Server options")')
    add_field_option(
        v,
        ServingOptions,
        "tokenizer_info_endpoint",
        "--enable-tokenizer-info-endpoint",
        action="store_true",
        help="serve GET /tokenizer_info, the tokenizer's configuration (it may show the chat template)",
    )
    add_field_option(
        v,
        ServingOptions,
        "force_include_usage",
        "--enable-force-include-usage",
        action="store_true",
        help="every stream carries usage, on each chunk and in a last chunk, as if it asked for "
        "include_usage and continuous_usage_stats",
    )
    add_field_option(
        v,
        ServingOptions,
        "return_tokens_as_token_ids",
        "--return-tokens-as-token-ids",
        action="store_true",
        help="logprobs name each token as token_id:N unless the request sets return_tokens_as_token_ids",
    )
    add_field_option(
        v,
        ServingOptions,
        "request_id_headers",
        "--enable-request-id-headers",
        action="store_true",
        help="every response carries X-Request-Id: the client's, else the response's id, else a new one",
    )


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    """Where braid keeps files and batch jobs, and the bounds on them (docs/batch.md)."""
    d = parser.add_argument_group("storage: /v1/files and /v1/batches (docs/batch.md)")
    d.add_argument(
        "--storage-dir",
        default=None,
        metavar="PATH",
        help="braid's store: the files' bytes and running jobs' rows, and its SQLite database unless --store "
        "names another (default: $XDG_DATA_HOME/braid, else ~/.local/share/braid)",
    )
    add_field_option(
        d,
        StoreOptions,
        "database",
        "--store",
        metavar="URL",
        help="the store's database: sqlite (in --storage-dir), or a postgresql:// URL (libpq's form), "
        "which keeps the files' bytes too, --storage-dir a copy (docs/batch.md)",
    )
    add_field_option(
        d,
        StoreOptions,
        "shared",
        "--store-shared",
        action="store_true",
        help="with --store postgresql://...: braids on the database share its batch jobs, each claiming "
        "lines a chunk at a time with a lease (docs/batch.md); without it one braid holds the database",
    )
    add_field_option(
        d,
        StoreOptions,
        "batch_chunk_lines",
        "--batch-chunk-lines",
        type=positive_int,
        metavar="N",
        help="with --store-shared: lines of a job a replica claims at once",
    )
    add_field_option(
        d,
        StoreOptions,
        "batch_lease",
        "--batch-lease",
        type=positive_int,
        metavar="SECONDS",
        help="with --store-shared: how long a replica's claim on lines lasts unless renewed (at least 3); "
        "a dead replica's lines are taken over after it",
    )
    add_field_option(
        d,
        StoreOptions,
        "max_file_bytes",
        "--max-file-bytes",
        type=positive_int,
        help="413 for an uploaded file larger than this, refused while it arrives",
    )
    add_field_option(
        d,
        StoreOptions,
        "max_storage_bytes",
        "--max-storage-bytes",
        type=positive_int,
        help="all stored files together (every key's); 413 for an upload that would pass it",
    )
    add_field_option(
        d,
        StoreOptions,
        "file_retention",
        "--file-retention",
        type=positive_int,
        metavar="SECONDS",
        help="files (uploads, outputs) are deleted this long after they were made",
    )
    add_field_option(
        d,
        StoreOptions,
        "batch_window",
        "--batch-completion-window",
        type=positive_int,
        metavar="SECONDS",
        help='what a batch\'s completion_window "24h" lasts; shorter to test expiry',
    )
    add_field_option(
        d,
        StoreOptions,
        "max_batch_lines",
        "--batch-max-lines",
        type=positive_int,
        metavar="N",
        help="requests one batch's input file may hold",
    )
    add_field_option(
        d,
        StoreOptions,
        "batch_group_lines",
        "--batch-group-lines",
        type=positive_int,
        metavar="N",
        help="consecutive lines of a batch job run under one admission ticket, each answered as it "
        "ends (1: every line a request of its own)",
    )
    add_field_option(
        d,
        StoreOptions,
        "response_retention",
        "--response-retention",
        type=positive_int,
        metavar="SECONDS",
        help="stored /v1/responses answers (store: true) are deleted this long after they were made",
    )
    add_field_option(
        d,
        StoreOptions,
        "max_response_bytes",
        "--max-response-bytes",
        type=positive_int,
        help="all stored /v1/responses answers together (every key's); past it the oldest are deleted first",
    )


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """The options of :class:`~braid.cli.engines.EngineOptions` but the switch interval (which
    ``serve`` lists with the server's): any sub-command that drives an engine takes them."""
    add_field_option(
        parser,
        EngineOptions,
        "engine",
        "--engine",
        choices=ENGINE_KINDS,
        help="auto: vLLM when installed, else the scripted engine",
    )
    add_field_option(
        parser, EngineOptions, "token_delay", "--token-delay", type=float, help="scripted engine: seconds per token"
    )
    e = parser.add_argument_group("vLLM engine")
    add_field_option(e, EngineOptions, "model", "--model", help="model path or name; none: braid's tiny local model")
    add_field_option(e, EngineOptions, "served_model_name", "--served-model-name")
    add_field_option(e, EngineOptions, "dtype", "--dtype")
    add_field_option(e, EngineOptions, "max_model_len", "--max-model-len", type=int)
    add_field_option(e, EngineOptions, "max_num_seqs", "--max-num-seqs", type=int)
    add_field_option(e, EngineOptions, "tensor_parallel_size", "--tensor-parallel-size", type=int)
    add_field_option(
        e,
        EngineOptions,
        "distributed_executor_backend",
        "--distributed-executor-backend",
        help="e.g. mp or ray (multi-GPU, multi-node)",
    )
    add_field_option(e, EngineOptions, "seed", "--seed", type=int)
    add_field_option(
        e,
        EngineOptions,
        "scheduling_policy",
        "--scheduling-policy",
        choices=("fcfs", "priority"),
        help="priority: the engine orders its waiting requests by their priority field too, and may "
        "preempt a running one for a better one (braid's admission orders by priority either way)",
    )
    add_field_option(e, EngineOptions, "enable_lora", "--enable-lora", action="store_true", help="serve LoRA adapters")
    add_field_option(
        e,
        EngineOptions,
        "lora_modules",
        "--lora-modules",
        type=lora_module,
        action="extend",
        nargs="+",
        metavar="NAME=PATH",
        help='LoRA adapters to serve, each NAME=PATH or JSON {"name": ..., "path": ...} (vLLM\'s forms); '
        "a request's model selects one by NAME (needs --enable-lora)",
    )
    add_field_option(e, EngineOptions, "max_loras", "--max-loras", type=int, help="LoRA adapters in one batch")
    add_field_option(e, EngineOptions, "max_lora_rank", "--max-lora-rank", type=int, help="the adapters' highest rank")
    add_field_option(
        e,
        EngineOptions,
        "kv_events_config",
        "--kv-events-config",
        type=json_object,
        metavar="JSON",
        help='KV-cache events on ZMQ for vllm-router\'s kv_aware, e.g. {"enable_kv_cache_events": true, '
        '"publisher": "zmq", "endpoint": "tcp://*:5557"} (vLLM\'s flag; docs/deploy.md)',
    )
    add_field_option(
        e,
        EngineOptions,
        "max_cpu_loras",
        "--max-cpu-loras",
        type=int,
        help="LoRA adapters the engine keeps loaded, least recently used out first (vLLM's default: --max-loras)",
    )
    add_field_option(
        e,
        Settings,
        "runtime_lora_updating",
        "--allow-runtime-lora-updating",
        action="store_true",
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter, as vLLM does with "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (which turns them on too)",
    )
    add_field_option(
        e,
        EngineOptions,
        "engine_args",
        "--engine-arg",
        type=engine_arg,
        action="append",
        metavar="KEY=VALUE",
        help="any other AsyncEngineArgs field; VALUE is JSON or a string (repeatable)",
    )
    add_field_option(
        e,
        EngineOptions,
        "engine_client",
        "--engine-client",
        choices=ENGINE_CLIENTS,
        help="trio: drive vLLM's engine core from braid's own thread (braid.engine.vllm_core); "
        "asyncio: vLLM's AsyncLLM on a second thread, through the asyncio bridge",
    )
    add_field_option(
        e,
        EngineOptions,
        "fault_hooks",
        "--fault-hooks",
        action="store_true",
        help="tests only: a prompt holding 'braid:fail@S' fails after S tokens",
    )


__all__ = ["add_engine_options", "add_serve", "add_serving_options", "add_storage_options", "build_parser"]
