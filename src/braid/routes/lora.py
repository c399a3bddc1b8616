"""``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``: vLLM's routes for LoRA
adapters at run time, served only when the operator allows them (``--allow-runtime-lora-updating``
or vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``; without, they are 404s as in vLLM). Behind the
API key like every route (:mod:`braid.http.auth`), a background key included.

The bodies are vLLM's (``LoadLoRAAdapterRequest``, ``UnloadLoRAAdapterRequest``); the rules and
errors are :class:`braid.engine.adapters.AdapterRegistry`'s. A success is vLLM's: a 200 whose
body is a sentence (``Success: LoRA adapter 'NAME' added successfully.``), sent as ``text/plain``
(vLLM sends it without a content type). An engine that cannot load adapters (the scripted engine
can, for tests) refuses every load with a 400.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from braid.engine.adapters import AdapterRegistry
from braid.errors import (
    BodyTooLarge,
    BraidError,
    EngineUnavailable,
    InvalidRequest,
    InvalidUserInput,
    ModelNotFound,
    SchemaError,
)
from braid.routes.common import require_json
from braid.wire.fields import decode_body
from braid.wire.openapi import Operation, Outcome, error_outcomes, json_body, ref


class LoadLoraBody(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """vLLM's ``LoadLoRAAdapterRequest``: ``load_inplace`` reloads a served name's weights from
    ``lora_path``; ``is_3d_lora_weight`` (MoE adapters) is taken and not used."""

    lora_name: str
    lora_path: str
    load_inplace: bool = False
    is_3d_lora_weight: bool = False


class UnloadLoraBody(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """vLLM's ``UnloadLoRAAdapterRequest`` (``lora_int_id`` is taken and not used, as in vLLM)."""

    lora_name: str
    lora_int_id: int | None = None


_LOAD = msgspec.json.Decoder(LoadLoraBody)
_UNLOAD = msgspec.json.Decoder(UnloadLoraBody)

NO_LORA = "This engine does not load LoRA adapters."


async def load_lora_adapter(
    registry: AdapterRegistry | None, read_body: Callable[[], Awaitable[bytes]], *, content_type: str | None
) -> str:
    """The success sentence, or a :class:`~braid.errors.BraidError` (see the module docstring)."""
    require_json(content_type)
    body = decode_body(await read_body(), _LOAD)
    if registry is None:
        raise InvalidRequest(NO_LORA)
    return await registry.load(body.lora_name, body.lora_path, inplace=body.load_inplace)


async def unload_lora_adapter(
    registry: AdapterRegistry | None, read_body: Callable[[], Awaitable[bytes]], *, content_type: str | None
) -> str:
    """The success sentence, or a :class:`~braid.errors.BraidError`."""
    require_json(content_type)
    body = decode_body(await read_body(), _UNLOAD)
    if registry is None:
        raise InvalidRequest(NO_LORA)
    return registry.unload(body.lora_name)


def _errors(*classes: type[BraidError]) -> tuple[Outcome, ...]:
    return error_outcomes(InvalidUserInput, SchemaError, BodyTooLarge, *classes)


_OK = {"text/plain": {"schema": {"type": "string"}}}

OPERATIONS = (
    Operation(
        "post",
        "/v1/load_lora_adapter",
        "Load a LoRA adapter and serve it under its name (vLLM's route, when runtime updating is allowed)",
        (
            Outcome(200, "Success: LoRA adapter 'NAME' added successfully.", _OK),
            *_errors(InvalidRequest, ModelNotFound, EngineUnavailable),
        ),
        request=json_body(ref(LoadLoraBody), {"load": {"lora_name": "sql-lora", "lora_path": "/adapters/sql"}}),
        structs=(LoadLoraBody,),
    ),
    Operation(
        "post",
        "/v1/unload_lora_adapter",
        "Stop serving a LoRA adapter (vLLM's route, when runtime updating is allowed)",
        (
            Outcome(200, "Success: LoRA adapter 'NAME' removed successfully.", _OK),
            *_errors(ModelNotFound),
        ),
        request=json_body(ref(UnloadLoraBody), {"unload": {"lora_name": "sql-lora"}}),
        structs=(UnloadLoraBody,),
    ),
)
"""The two routes' OpenAPI entries (documented only when they are served)."""


__all__ = ["OPERATIONS", "LoadLoraBody", "UnloadLoraBody", "load_lora_adapter", "unload_lora_adapter"]
