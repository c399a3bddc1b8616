"""The vLLM tier's braid server is the session fixture ``vllm_server`` of tests/conftest.py,
shared with the parity tier (tests/parity): engine starts cost 15-40 s."""
