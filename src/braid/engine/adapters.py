"""LoRA adapters loaded and unloaded while the server runs: vLLM's ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` (served by :mod:`braid.routes.lora` when the operator allows it).

The served adapters are the engine's ``info.adapters``, which every request reads when it
selects one (:func:`braid.engine.base.select_model`) and ``/v1/models`` lists; after start-up,
:class:`AdapterRegistry` is the only writer, and it replaces the tuple whole, so a request sees
the set before or after a change, never half of one. The rules are vLLM 0.32's
(``OpenAIServingModels``):

* **load** ``(name, path)``: refused (400 ``InvalidUserInput``) when either is empty, when the
  name is the model's own, or when an adapter of that name is served and ``inplace`` is false.
  Otherwise the engine loads the weights (:meth:`~braid.engine.base.LoraLoader.add_lora`) and,
  once it has them, the name is served. A new name gets the next id (never one used before, so
  the engine's cache cannot confuse two adapters); ``inplace`` keeps the name's id and reloads
  its weights from ``path``. No adapter at ``path``: vLLM's 404; an adapter the engine cannot
  take (rank, modules, LoRA off): a 400 (vLLM answers a 500 there: docs/compatibility.md).
* **unload** ``name``: the name is no longer served (a request naming it is vLLM's 404). As in
  vLLM the engine keeps the weights in its adapter cache: a request already running with the
  adapter finishes with it, untouched; the cache holds at most ``--max-cpu-loras`` adapters
  (least recently used out first), so unloaded adapters cost nothing lasting.
* **bounds**: at most :data:`MAX_ADAPTERS` names are served at once (vLLM has no bound; a 400
  beyond it). How many adapters the engine holds is vLLM's: ``--max-cpu-loras`` in its cache,
  ``--max-loras`` in one batch (a request whose adapter finds no free slot waits in the engine's
  queue); an adapter out of the cache is loaded again from its path by the next request naming it.

Loads are serialised (one lock), so two loads of one name cannot both pass the checks. A load is
shielded from cancellation once it has been sent to the engine: a client that goes away cannot
leave weights in the engine that no name serves.
"""

from __future__ import annotations

import attrs
import trio

from braid.engine.base import LoraAdapter, LoraLoader, ModelInfo
from braid.errors import InvalidRequest, InvalidUserInput, ModelNotFound

MAX_ADAPTERS = 1024
"""The most adapter names served at once (each load of a new name adds one)."""


def adapter_not_found(name: str, path: str) -> ModelNotFound:
    """vLLM's 404 for a load whose path holds no adapter (its ``LoRAAdapterNotFoundError``)."""
    return ModelNotFound(f"Loading lora {name} failed: No adapter found for {path}")


def _next_id(info: ModelInfo) -> int:
    return max((a.id for a in info.adapters), default=0) + 1


@attrs.define(eq=False)
class AdapterRegistry:
    """The adapters of one engine, as the load and unload routes change them (module docstring)."""

    engine: LoraLoader
    limit: int = MAX_ADAPTERS
    _next: int = attrs.field(init=False)
    _lock: trio.Lock = attrs.field(init=False, factory=trio.Lock)

    def __attrs_post_init__(self) -> None:
        self._next = _next_id(self.engine.info)

    @property
    def adapters(self) -> tuple[LoraAdapter, ...]:
        return self.engine.info.adapters

    async def load(self, name: str, path: str, *, inplace: bool = False) -> str:
        """Serve the adapter at ``path`` as ``name``; vLLM's success message, or a BraidError."""
        async with self._lock:
            info = self.engine.info
            if not name or not path:
                raise InvalidUserInput("Both 'lora_name' and 'lora_path' must be provided.")
            if name == info.name:
                raise InvalidUserInput(f"The lora adapter '{name}' conflicts with a served base model.")
            served = {a.name: a for a in info.adapters}
            if name in served and not inplace:
                raise InvalidUserInput(
                    f"The lora adapter '{name}' has already been loaded. If you want to load the "
                    "adapter in place, set 'load_inplace' to True."
                )
            if name not in served and len(served) >= self.limit:
                raise InvalidRequest(
                    f"{len(served)} LoRA adapters are served, the most this server takes; unload one first."
                )
            previous = served.get(name)
            adapter = LoraAdapter(name, previous.id if previous else self._next, path, info.name)
            with trio.CancelScope(shield=True):
                await self.engine.add_lora(adapter, inplace=inplace)
            if previous is None:
                self._next += 1
            now = self.engine.info.adapters
            if any(a.name == name for a in now):  # in its place, as vLLM's dict keeps a reloaded name's
                now = tuple(adapter if a.name == name else a for a in now)
            else:
                now = (*now, adapter)
            self.engine.info = attrs.evolve(self.engine.info, adapters=now)
            return f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, name: str) -> str:
        """Serve ``name`` no more; vLLM's success message, or a BraidError. Requests running with
        it are not touched (module docstring)."""
        if not name:
            raise InvalidUserInput("'lora_name' needs to be provided to unload a LoRA adapter.")
        info = self.engine.info
        if name not in {a.name for a in info.adapters}:
            raise ModelNotFound(f"The lora adapter '{name}' cannot be found.")
        self.engine.info = attrs.evolve(info, adapters=tuple(a for a in info.adapters if a.name != name))
        return f"Success: LoRA adapter '{name}' removed successfully."


__all__ = ["MAX_ADAPTERS", "AdapterRegistry", "adapter_not_found"]
