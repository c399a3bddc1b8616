"""The engine boundary: what braid needs from an LLM engine, and the engines that provide it."""

from braid.engine.base import (
    ChoiceDelta,
    Engine,
    EngineOutput,
    EngineRequest,
    Logprob,
    ModelInfo,
    SamplingParams,
    Tokenizer,
    TopLogprobs,
)

__all__ = [
    "ChoiceDelta",
    "Engine",
    "EngineOutput",
    "EngineRequest",
    "Logprob",
    "ModelInfo",
    "SamplingParams",
    "TopLogprobs",
    "Tokenizer",
]
