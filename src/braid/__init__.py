"""braid: a batched, OpenAI-compatible /v1/completions front end for vLLM, on Trio."""

__version__ = "0.1.0"

__all__ = ["__version__"]
