"""A KV connector that moves no KV cache: for the tests of ``kv_transfer_params`` in responses.

vLLM loads it from this module by name (``--kv-transfer-config '{"kv_connector":
"KVEchoConnector", "kv_connector_module_path": "tools.kv_echo", "kv_role": "kv_both"}'``), as
it loads any out-of-tree connector; the engine then runs with a KV connector as in a
disaggregated deployment. When a request finishes, the connector hands the engine what the
request's ``kv_transfer_params`` asked it to: the object under ``"echo"`` (any other request:
none), which vLLM puts on the request's last output and its server in the response body. A real
connector (NIXL, Mooncake) returns the parameters the next stage needs in the same place.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata


class KVEchoConnector(KVConnectorBase_V1):
    """Loads and saves nothing; gives back ``kv_transfer_params["echo"]`` when a request ends."""

    # scheduler side
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        params = request.kv_transfer_params or {}
        echo = params.get("echo")
        return False, ({"echoed": echo, "prompt_tokens": len(request.prompt_token_ids or ())} if echo else None)

    # worker side
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None


CONFIG = {"kv_connector": "KVEchoConnector", "kv_connector_module_path": "tools.kv_echo", "kv_role": "kv_both"}
"""The engine's ``kv_transfer_config`` for it."""

__all__ = ["CONFIG", "KVEchoConnector"]
