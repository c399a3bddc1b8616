"""The front end's options, with their defaults in one place.

:class:`Settings` is built once per app (``braid serve``'s flags, or a test's values) and passed
down whole: the view reads its limits from it, the run its buffer, stall timeout and heartbeat
period. ``braid serve``'s flags take their defaults from ``Settings()``.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Settings:
    max_prompts: int = attrs.field(default=1024, validator=attrs.validators.gt(0))
    """Prompts per request."""
    max_choices: int = attrs.field(default=4096, validator=attrs.validators.gt(0))
    """Prompts x n per request."""
    buffer: int = attrs.field(default=64, validator=attrs.validators.gt(0))
    """Outputs a run's channel holds before its drivers wait for the consumer."""
    # Both > 0: a heartbeat of 0 would make every stream's clock spin (braid.heartbeat).
    stall_timeout: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))
    """A driver that cannot hand an output over for this long fails the run (the client stopped reading)."""
    heartbeat: float = attrs.field(default=15.0, validator=attrs.validators.gt(0))
    """An idle stream sends an SSE comment after this many seconds."""
    prompt_tokens_details: bool = False
    """vLLM's --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens."""


__all__ = ["Settings"]
