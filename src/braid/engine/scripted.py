"""A deterministic engine for tests, property tests and front-end benchmarks.

Tokens are bytes: id 0 is ``<s>`` (BOS, added to text prompts), 1 is ``</s>`` (EOS), 2 is
``<pad>``, and id ``b + 3`` is the byte ``b``; the vocabulary has 259 ids. Generated tokens are
drawn from lower-case letters and the space, so every token decodes to one character.

Choice ``k`` of a request generates a seeded function of (seed, prompt ids, k, step); with
``temperature == 0`` every choice is the same greedy sequence. Unless ``ignore_eos``, a step
after ``min_tokens`` emits EOS with probability 1/24.

Structured output: only a ``choice`` constraint, of ASCII strings (one byte token per character).
Choice ``k`` emits one of the strings, picked by the same seeded function of (seed, prompt ids,
k), then EOS (whatever ``ignore_eos`` and ``min_tokens`` say: the constraint allows nothing
more, as a grammar that is complete allows only EOS in vLLM); ``max_tokens`` and stop strings cut
it as they cut any text. :meth:`ScriptedEngine.check_structured` refuses every other constraint
with a 400. Stop strings (with vLLM's hold-back of
text that may still become a stop string), stop token ids, ``logprobs`` and ``prompt_logprobs``
are honoured; the other sampling parameters (top_p, penalties, logit_bias...) are accepted and
have no effect here.

A choice's text is decoded from its bytes as vLLM's detokenizer decodes byte-fallback tokens:
the bytes of a UTF-8 character that is not complete yet are held back until it is (a scripted
reply's ``é`` comes as one character, in the output of its second byte); those still incomplete
when the choice ends by EOS, a stop token or ``max_tokens`` come out as U+FFFD, as
:meth:`ByteTokenizer.decode` gives them.

**Pace.** With ``token_delay > 0`` the engine generates on its own clock, as a real engine does:
a request's task produces one token per choice every ``token_delay`` seconds whether or not its
outputs are taken, and the deltas its reader has not taken yet merge into one pending output
(what vLLM's output collector does for a reader that lags). With ``token_delay == 0`` it runs in
**lockstep** with its reader instead: each token is generated when the previous output has been
taken, so every token is one output (the front-end ceiling benchmark measures one event per
token this way; an engine with no clock would otherwise produce a whole completion at once).
A ``final_only`` request is generated the same way and delivered as one output when it finishes:
the deltas of each choice joined (:func:`join_deltas`).

Every output reports ``num_cached_tokens`` from a :class:`PrefixCache` of 16-token blocks, as
if each request's prefill ended before the next one's began (requests are read in the order
they are opened).

Fault hooks, read from the prompt's text (token-id prompts are decoded first):

* ``braid:fail@S`` -- the request fails with :class:`~braid.errors.EngineError` after ``S`` tokens.
* ``braid:invalid`` -- the request is rejected by the engine (:class:`~braid.errors.EngineRejected`)
  at its first step, after braid has admitted it and a stream may have started, as vLLM's lazy
  validation does.

A reply hook, read the same way, makes the engine write what a test needs (a tool call, a
reasoning block):

* ``<braid:say>TEXT</braid:say>`` -- each choice emits TEXT (any characters up to the first
  closing tag, newlines included) instead of drawn letters: its UTF-8 bytes, one byte token per
  step, then EOS with ``finish_reason`` "stop". With several blocks in the prompt, choice ``k``
  emits the ``k``-th modulo their number (whatever the temperature), so that ``n > 1`` choices
  can differ. The script is generated text like any other: ``max_tokens`` cuts it ("length"),
  stop strings and stop token ids end it (``include_stop_str_in_output`` as usual), its tokens
  have logprobs (the scripted token first). The EOS after it waits for ``min_tokens``, with
  drawn letters meanwhile; with ``ignore_eos`` drawn letters follow it up to ``max_tokens``, as
  a model would go on. A ``choice`` constraint wins over a script: the choice is emitted.

A fault fires when its step is generated (on the engine's clock, read or not): the request's
``on_failure`` is called then, and its reader gets the error next, in place of any output still
waiting (as in vLLM's output collector, an error replaces what the reader had not taken).

The engine counts requests in flight, finished, failed and aborted, and keeps the ids of aborted
and failed requests (so a test can see that none was aborted twice) and each batch a run asked to
abort at once. :meth:`ScriptedEngine.wait_until` waits for a condition on those counts, woken at
each change of them (a test waits on the engine this way, instead of polling it).

LoRA adapters (:meth:`ScriptedEngine.add_lora`): a folder with an ``adapter_config.json`` is taken
(and recorded in ``loras``), anything else is vLLM's 404; generation ignores adapters.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import re
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from braid.engine.adapters import adapter_not_found
from braid.engine.base import (
    ChoiceDelta,
    Deliver,
    Ending,
    EngineOutput,
    EngineRequest,
    FailureHandler,
    Logprob,
    LoraAdapter,
    ModelInfo,
    Observe,
    SamplingParams,
    TopLogprobs,
)
from braid.engine.faults import fault_after, injected_failure
from braid.errors import ENGINE_DOWN, BraidError, EngineError, EngineRejected, EngineUnavailable, InvalidRequest

BOS, EOS, PAD = 0, 1, 2
_SPECIAL = {BOS: "<s>", EOS: "</s>", PAD: "<pad>"}
_OFFSET = 3
VOCAB_SIZE = 256 + _OFFSET
_ALPHABET = tuple(ord(c) + _OFFSET for c in "abcdefghijklmnopqrstuvwxyz ")
_SAY = re.compile(r"<braid:say>(.*?)</braid:say>", re.DOTALL)
_UTF8 = codecs.getincrementaldecoder("utf-8")


class ByteTokenizer:
    """Byte-level tokenizer with three special tokens (see the module docstring)."""

    vocab_size = VOCAB_SIZE
    max_chars_per_token = max(map(len, _SPECIAL.values()))  # "<pad>"; every byte token is 1 character
    bos_token_id = BOS
    eos_token_id = EOS
    _hf_view: HfView | None = None

    def parser_tokenizer(self) -> HfView:
        """This tokenizer as vLLM's parsers read it (:class:`HfView`), made once."""
        if self._hf_view is None:
            self._hf_view = HfView(self)
        return self._hf_view

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = [b + _OFFSET for b in text.encode("utf-8")]
        return [BOS, *ids] if add_special_tokens else ids

    def encode_many(self, texts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]:
        return [self.encode(t, add_special_tokens=add_special_tokens) for t in texts]  # stateless

    def decode(self, token_ids: tuple[int, ...] | list[int], *, skip_special_tokens: bool = True) -> str:
        out = bytearray()
        for t in token_ids:
            if t >= _OFFSET:
                out.append(t - _OFFSET)
            elif not skip_special_tokens:
                out += _SPECIAL[t].encode()
        return out.decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        if token_id < _OFFSET:
            return _SPECIAL[token_id]
        return bytes([token_id - _OFFSET]).decode("utf-8", errors="replace")

    def token_strs(self, token_ids: Sequence[int]) -> list[str]:
        """Special tokens by name, printable ASCII bytes as themselves, other bytes as ``<0xNN>``
        (a byte-fallback vocabulary's spelling)."""
        out = []
        for t in token_ids:
            b = t - _OFFSET
            out.append(_SPECIAL[t] if t < _OFFSET else chr(b) if 0x20 <= b < 0x7F else f"<0x{b:02X}>")
        return out

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
        chat_template: str | None,
        template_kwargs: Mapping[str, Any],
        tools: list[Mapping[str, Any]] | None = None,
    ) -> str:
        """The tiny model's format (``braid.models.tiny.CHAT_TEMPLATE``) in Python, plus tools and
        tool calls, which the tiny template ignores: written here so that front-end tests see what
        reaches a template. In order:

        * with tools (a non-empty list): ``<|tools|>\n``, each tool as one line of JSON, ``</s>\n``;
        * each message: ``<|role|>``, then ``[tool_call_id]`` when the message has that key (a
          tool message), ``\n``, its content, then each tool call as ``\n<tool_call>JSON</tool_call>``
          (the call's whole dict: id, function with the arguments as an object, type), ``</s>\n``;
        * ``<|assistant|>\n`` as the generation prompt; a continued final message loses its ``</s>\n``.

        JSON is ``json.dumps`` with its default separators, non-ASCII as it is. A request's own
        template is refused (there is no jinja here)."""
        if chat_template is not None:
            raise EngineRejected("The scripted engine renders its own chat format only.", param="chat_template")
        parts = []
        if tools:
            parts.append("<|tools|>\n" + "".join(_json(t) + "\n" for t in tools) + "</s>\n")
        for m in messages:
            call_id = f"[{m['tool_call_id']}]" if "tool_call_id" in m else ""
            calls = "".join(f"\n<tool_call>{_json(c)}</tool_call>" for c in m.get("tool_calls") or ())
            parts.append(f"<|{m['role']}|>{call_id}\n{m['content']}{calls}</s>\n")
        text = "".join(parts)
        if continue_final_message:
            return text[: -len("</s>\n")]
        return text + "<|assistant|>\n" if add_generation_prompt else text


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


class HfView:
    """A :class:`ByteTokenizer` through the part of Hugging Face's tokenizer interface that vLLM's
    tool-call and reasoning parsers use (``ByteTokenizer.parser_tokenizer()``).

    The vocabulary spells each id as ``token_strs`` does: ``<s>``, ``</s>``, ``<pad>``, printable
    ASCII bytes as themselves, other bytes as ``<0xNN>``. It has no multi-character token, so a
    parser that looks its tags up as single tokens (``<think>``) finds none and matches them in
    the text instead, if it can. ``get_vocab()`` returns the one dict built here, as vLLM's cached
    tokenizer does (the parsers read it and never change it). ``decode`` skips the special tokens
    unless told otherwise, unlike Hugging Face: this engine's text never holds them (EOS ends a
    choice), so a parser that decodes a choice's token ids gets the text the engine emitted.
    """

    name_or_path = "scripted"

    def __init__(self, tokenizer: ByteTokenizer) -> None:
        self._tok = tokenizer
        self._tokens = tokenizer.token_strs(range(VOCAB_SIZE))
        self._vocab = {t: i for i, t in enumerate(self._tokens)}
        self.all_special_ids = sorted(_SPECIAL)
        self.all_special_tokens = [_SPECIAL[i] for i in self.all_special_ids]
        self.bos_token_id = tokenizer.bos_token_id
        self.eos_token_id = tokenizer.eos_token_id

    @property
    def vocab(self) -> dict[str, int]:
        return self._vocab

    def get_vocab(self) -> dict[str, int]:
        return self._vocab

    def encode(self, text: str, add_special_tokens: bool = True, **_: Any) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: int | Sequence[int], skip_special_tokens: bool = True, **_: Any) -> str:
        return self._tok.decode([ids] if isinstance(ids, int) else list(ids), skip_special_tokens=skip_special_tokens)

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | None | list[int | None]:
        """None for a token the vocabulary does not have, as Hugging Face's slow tokenizers."""
        if isinstance(tokens, str):
            return self._vocab.get(tokens)
        return [self._vocab.get(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> str | list[str]:
        if isinstance(ids, int):
            return self._tokens[ids]
        return [self._tokens[i] for i in ids if not (skip_special_tokens and i in _SPECIAL)]


_TOKENIZER = ByteTokenizer()


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from the parts."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return struct.unpack("<Q", digest)[0] / 2**64


_MASK64 = 2**64 - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _seed_of(*parts: object) -> int:
    """A choice's 64-bit seed, hashed once: its tokens are drawn from it by :func:`_draw`."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


def _draw(seed: int, step: int) -> int:
    """A deterministic 64-bit number for a choice's step (SplitMix64's output function).

    A few integer operations instead of hashing the prompt at every token: the front-end ceiling
    (bench/ceiling.py) runs this engine at full speed, so its per-token cost counts as braid's.
    """
    x = (seed + (step + 1) * _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _logprob_of(*parts: object) -> float:
    return math.log(0.05 + 0.9 * _unit("lp", *parts))


def _top(token_id: int, k: int, *parts: object) -> TopLogprobs:
    """The logprobs dict at one position: the actual token first, then ``k`` ranked alternatives."""
    tok = _TOKENIZER
    out = {
        token_id: Logprob(_logprob_of(token_id, *parts), 1 + int(_unit("rank", *parts) * 4), tok.token_text(token_id))
    }
    rank = 1
    for alt in _ALPHABET:
        if len(out) > k:
            break
        if alt not in out:
            out[alt] = Logprob(_logprob_of(alt, *parts) - rank, rank, tok.token_text(alt))
            rank += 1
    return out


@attrs.define
class _Choice:
    k: int
    seed: int = 0  # what its tokens are drawn from (_draw)
    script: bytes | None = None  # what it says (<braid:say>) before it draws letters
    text: str = ""
    emitted: int = 0
    tokens: int = 0
    finished: bool = False
    utf8: codecs.IncrementalDecoder | None = None
    """Made at its first byte that is not ASCII: it holds back the bytes of an incomplete character."""


@attrs.define(eq=False)
class _Generation:
    """The state of one running request; :meth:`steps` makes its outputs, each handed to
    ``observe`` as it is made, before any merging (lockstep's ``final_only`` join, or
    :class:`_Pending`'s for a lagging reader) and before ``deliver``."""

    request: EngineRequest
    token_delay: float
    fail_after: int | None
    invalid: bool
    cached_tokens: int = 0
    scripts: tuple[bytes, ...] = ()  # the prompt's <braid:say> texts
    observe: Observe | None = None
    ending: Ending | None = None
    """Told once ``ending.after`` tokens are made (a request of one choice; see braid.engine.base)."""
    finished: bool = False
    failure: BraidError | None = None  # the fault that ended it

    def _next_token(self, choice: _Choice) -> int:
        p = self.request.params
        k = choice.k if p.temperature > 0 else 0
        if p.structured_outputs is not None and p.structured_outputs.choice is not None:
            options = p.structured_outputs.choice
            picked = options[int(_unit("choice", p.seed, self.request.prompt_token_ids, k) * len(options))]
            data = picked.encode("ascii")  # ASCII only (check_structured): one token per character
            return data[choice.tokens] + _OFFSET if choice.tokens < len(data) else EOS
        # the low half decides EOS (unless a script does), the high half picks the letter
        x = _draw(choice.seed, choice.tokens)
        script = choice.script
        if script is not None:
            if choice.tokens < len(script):
                return script[choice.tokens] + _OFFSET
            if not p.ignore_eos and choice.tokens >= p.min_tokens:
                return EOS  # said: it ends as soon as it may
        elif not p.ignore_eos and choice.tokens >= p.min_tokens and (x & 0xFFFFFFFF) * 24 < 2**32:
            return EOS
        return _ALPHABET[((x >> 32) * len(_ALPHABET)) >> 32]

    def _step(self, choice: _Choice) -> ChoiceDelta:
        p = self.request.params
        token = self._next_token(choice)
        choice.tokens += 1
        logprobs = None
        if p.logprobs is not None:
            logprobs = (_top(token, p.logprobs, self.request.prompt_token_ids, choice.k, choice.tokens),)
        finish: str | None = None
        stop_reason: str | int | None = None
        if token == EOS:
            finish = "stop"
        elif token in p.stop_token_ids and choice.tokens > p.min_tokens:
            finish, stop_reason = "stop", token
        else:
            if token < 0x80 + _OFFSET and choice.utf8 is None:
                choice.text += chr(token - _OFFSET)  # ASCII, the drawn letters: the fast path
            else:
                if choice.utf8 is None:
                    choice.utf8 = _UTF8("replace")
                choice.text += choice.utf8.decode(bytes((token - _OFFSET,)))
            for s in p.stop:
                at = choice.text.find(s, max(0, choice.emitted - len(s)))
                if at >= 0:
                    end = at + len(s) if p.include_stop_str_in_output else at
                    choice.text = choice.text[:end]
                    finish, stop_reason = "stop", s
                    break
        if finish is None and choice.tokens >= p.max_tokens:
            finish = "length"
        if finish is None:
            hold = max((len(s) - 1 for s in p.stop), default=0)
            upto = max(choice.emitted, len(choice.text) - hold)
        else:
            if choice.utf8 is not None and not isinstance(stop_reason, str):
                # What is left of an incomplete character (after a stop string, it is cut off).
                choice.text += choice.utf8.decode(b"", final=True)
            upto = len(choice.text)
            choice.finished = True
        text = choice.text[choice.emitted : upto]
        choice.emitted = upto
        return ChoiceDelta(choice.k, text, (token,), logprobs, finish, stop_reason)

    def _prompt_logprobs(self) -> tuple[TopLogprobs | None, ...] | None:
        k = self.request.params.prompt_logprobs
        if k is None:
            return None
        ids = self.request.prompt_token_ids
        return (None, *(_top(t, k, ids[:i], "prompt") for i, t in enumerate(ids) if i > 0))

    async def steps(self) -> AsyncGenerator[EngineOutput, None]:
        """The request's outputs, one per step, each ``token_delay`` after the previous one (one
        scheduler round when 0); raises the request's fault when its step comes."""
        await trio.lowlevel.checkpoint()
        if self.invalid:
            raise EngineRejected("The scripted engine rejected this prompt (braid:invalid).", param="prompt")
        ids = self.request.prompt_token_ids
        p = self.request.params
        scripts = self.scripts
        choices = [
            _Choice(
                k, _seed_of(p.seed, ids, k if p.temperature > 0 else 0), scripts[k % len(scripts)] if scripts else None
            )
            for k in range(p.n)
        ]
        prompt_logprobs = self._prompt_logprobs()
        observe = self.observe
        produced = 0
        ending_after = self.ending.after if self.ending is not None and p.n == 1 else -1
        # In lockstep, a final_only request's steps run back to back: nobody reads between them
        # (vLLM's FINAL_ONLY wakes its reader once too), so the ceiling's non-streaming run
        # measures braid, not a scheduler round per token of this test double.
        per_step = self.token_delay > 0 or not self.request.final_only
        while True:
            if self.token_delay > 0:
                await trio.sleep(self.token_delay)
            elif per_step:
                await trio.lowlevel.checkpoint()
            if self.fail_after is not None and produced >= self.fail_after:
                raise injected_failure(self.fail_after)
            deltas = tuple(self._step(c) for c in choices if not c.finished)
            produced += 1
            done = all(c.finished for c in choices)
            self.finished = done
            output = EngineOutput(ids, deltas, done, prompt_logprobs, self.cached_tokens)
            if observe is not None:
                observe(output)
            if produced == ending_after:
                assert self.ending is not None
                self.ending.call()
            yield output
            prompt_logprobs = None
            if done:
                return

    def _failed(self, exc: BraidError, on_failure: FailureHandler | None) -> None:
        self.failure = exc
        if on_failure is not None:
            on_failure(exc)

    async def lockstep(self, on_failure: FailureHandler | None) -> AsyncGenerator[EngineOutput, None]:
        """Generated as the reader asks: each step when the previous output was taken."""
        try:
            if self.request.final_only:
                yield join_deltas([output async for output in self.steps()])
            else:
                async for output in self.steps():
                    yield output
        except (EngineError, EngineRejected) as exc:
            self._failed(exc, on_failure)
            raise

    async def generate(self, pending: _Pending, on_failure: FailureHandler | None) -> None:
        """Generated on the engine's own clock into ``pending``, taken or not (a task's body)."""
        try:
            async for output in self.steps():
                pending.put(output)
        except (EngineError, EngineRejected) as exc:
            pending.fail(exc)
            self._failed(exc, on_failure)


class _Pending:
    """What a request has generated and its reader has not taken yet: its deltas (merged into one
    output when taken, as vLLM's ``RequestOutputCollector`` merges them), or its error, which
    replaces them. A ``final_only`` request's output is ready only once it has finished.

    A streamed output that finds nothing held goes to ``deliver`` when there is one and it takes
    it (braid.engine.base); the reader is then woken only for the last."""

    __slots__ = ("_delivered_last", "_error", "_final_only", "_held", "_wakeup", "deliver")

    def __init__(self, final_only: bool, deliver: Deliver | None = None) -> None:
        self._final_only = final_only
        self._held: list[EngineOutput] = []
        self._error: BraidError | None = None
        self._wakeup: trio.Event | None = None
        self._delivered_last = False
        self.deliver = None if final_only else deliver

    def put(self, output: EngineOutput) -> None:
        deliver = self.deliver
        if not self._held and deliver is not None and deliver(output):
            if output.finished:
                self._delivered_last = True
                self._wake()
            return
        held = self._held
        if held and not self._final_only:
            held[0] = join_deltas([held[0], output])  # merged as it comes: one output waits, not a list
        else:
            held.append(output)
        if not self._final_only or output.finished:
            self._wake()

    def fail(self, exc: BraidError) -> None:
        self._error = exc
        self._held.clear()
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None

    def _ready(self) -> bool:
        if self._error is not None or self._delivered_last:
            return True
        return bool(self._held) and (not self._final_only or self._held[-1].finished)

    async def outputs(self) -> AsyncGenerator[EngineOutput, None]:
        while True:
            while not self._ready():
                self._wakeup = wakeup = trio.Event()
                await wakeup.wait()
            if self._error is not None:
                raise self._error
            if not self._held:  # the last output was delivered
                return
            held, self._held = self._held, []
            output = held[0] if len(held) == 1 else join_deltas(held)
            yield output
            if output.finished:
                return


def join_deltas(outputs: Sequence[EngineOutput]) -> EngineOutput:
    """One output holding what ``outputs`` (one request's deltas, in order) hold together."""
    parts: dict[int, list[ChoiceDelta]] = {}
    for output in outputs:
        for delta in output.choices:
            parts.setdefault(delta.index, []).append(delta)
    choices = []
    for k in sorted(parts):
        ds = parts[k]
        lps = [lp for d in ds for lp in (d.logprobs or ())] if ds[0].logprobs is not None else None
        choices.append(
            ChoiceDelta(
                k,
                "".join(d.text for d in ds),
                tuple(t for d in ds for t in d.token_ids),
                None if lps is None else tuple(lps),
                ds[-1].finish_reason,
                ds[-1].stop_reason,
            )
        )
    first, last = outputs[0], outputs[-1]
    return EngineOutput(
        first.prompt_token_ids, tuple(choices), last.finished, first.prompt_logprobs, first.num_cached_tokens
    )


@attrs.define(eq=False)
class PrefixCache:
    """Which prompt prefixes, in whole blocks, earlier requests have read (vLLM's rule: a block
    is found only after every block before it, and the prompt's last token is always computed).

    Blocks are keyed by a chained hash, so a lookup costs one hash per block. When it holds
    ``capacity`` blocks it forgets them all, which keeps a long-running test server bounded.
    """

    block_size: int = 16
    capacity: int = 1 << 16
    _blocks: set[int] = attrs.field(factory=set)

    def read(self, ids: Sequence[int]) -> int:
        """The number of ``ids`` found cached; then every whole block of ``ids`` is cached."""
        if len(self._blocks) >= self.capacity:
            self._blocks.clear()
        cached, key, hit, b = 0, 0, True, self.block_size
        for end in range(b, len(ids) + 1, b):
            key = hash((key, tuple(ids[end - b : end])))
            if hit and key in self._blocks and end < len(ids):
                cached = end
            else:
                hit = False
            self._blocks.add(key)
        return cached


@attrs.define(eq=False)
class ScriptedEngine:
    """A deterministic engine (see the module docstring)."""

    token_delay: float = 0.0
    info: ModelInfo = attrs.field(
        factory=lambda: ModelInfo(name="scripted", root="braid/scripted", max_model_len=2048, vocab_size=VOCAB_SIZE)
    )
    tokenizer: ByteTokenizer = attrs.field(factory=ByteTokenizer)
    healthy: bool = True
    in_flight: int = 0
    finished_total: int = 0
    aborted_ids: list[str] = attrs.field(factory=list)
    failed_ids: list[str] = attrs.field(factory=list)
    batch_aborts: list[tuple[str, ...]] = attrs.field(factory=list)
    prefix_cache: PrefixCache = attrs.field(factory=PrefixCache)
    loras: list[tuple[LoraAdapter, bool]] = attrs.field(factory=list)
    """Each adapter :meth:`add_lora` took, with its ``inplace``."""
    _changed: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot, init=False, repr=False)
    """Woken when a request opens, fails or ends (what the counts above change with)."""

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds, checked now and again each time a request opens,
        fails or ends; bound it with ``trio.fail_after``."""
        while not condition():
            await self._changed.park()

    @property
    def aborted_total(self) -> int:
        return len(self.aborted_ids)

    @property
    def failed_total(self) -> int:
        return len(self.failed_ids)

    def unfinished_requests(self) -> int:
        return self.in_flight

    def abort_requests(self, request_ids: Sequence[str]) -> None:
        """Records the batch; each request's own ``open_request`` exit still does the abort."""
        self.batch_aborts.append(tuple(request_ids))

    async def add_lora(self, adapter: LoraAdapter, *, inplace: bool = False) -> None:
        """Takes a folder with an ``adapter_config.json`` (vLLM's 404 otherwise), after a checkpoint."""
        await trio.lowlevel.checkpoint()
        if not (Path(adapter.path) / "adapter_config.json").is_file():
            raise adapter_not_found(adapter.name, adapter.path)
        self.loras.append((adapter, inplace))

    def check_structured(self, params: SamplingParams) -> None:
        """Only ``choice``, of ASCII strings (see the module docstring); anything else is a 400."""
        structured = params.structured_outputs
        if structured is None:
            return
        if structured.choice is None:
            raise InvalidRequest(
                f"The scripted engine supports only structured_outputs.choice, not {structured.kind} "
                f"(from {structured.source}).",
                param=structured.source,
            )
        if not all(c.isascii() for c in structured.choice):
            raise InvalidRequest(
                "The scripted engine's choices must be ASCII text (its tokens are bytes).", param=structured.source
            )

    @asynccontextmanager
    async def open_request(
        self,
        request: EngineRequest,
        on_failure: FailureHandler | None = None,
        deliver: Deliver | None = None,
        *,
        observe: Observe | None = None,
        ending: Ending | None = None,
    ) -> AsyncIterator[AsyncIterator[EngineOutput]]:
        """Run one request (see the module docstring for its pace, faults and script). Leaving
        early (cancellation included) aborts it; nothing here waits for anything on exit. On its
        own clock it delivers outputs with ``deliver``; in lockstep its reader asks for each.
        ``observe`` sees every step's output as it is made, in both, and ``ending`` is called
        as its step comes, before that step's output is handed on."""
        if not self.healthy:
            raise EngineUnavailable(ENGINE_DOWN)
        try:
            self.check_structured(request.params)  # braid checks before; a direct caller may not
        except InvalidRequest as exc:
            raise EngineRejected(exc.message, param=exc.param) from None
        text = self.tokenizer.decode(request.prompt_token_ids)
        gen = _Generation(
            request,
            self.token_delay,
            fault_after(text),
            "braid:invalid" in text,
            self.prefix_cache.read(request.prompt_token_ids),
            tuple(say.encode() for say in _SAY.findall(text)),
            observe,
            ending,
        )

        def failed(err: BraidError) -> None:
            self.failed_ids.append(request.request_id)  # when it fails, not when it is read
            self._changed.unpark_all()
            if on_failure is not None:
                on_failure(err)

        self.in_flight += 1
        self._changed.unpark_all()
        try:
            if self.token_delay > 0:
                async with _on_own_clock(gen, failed, deliver) as outputs:
                    yield outputs
            else:
                outputs = gen.lockstep(failed)
                try:
                    yield outputs
                finally:
                    await outputs.aclose()  # the generator's cleanup never awaits: safe when cancelled
        finally:
            self.in_flight -= 1
            if gen.finished:
                self.finished_total += 1
            elif gen.failure is None:
                self.aborted_ids.append(request.request_id)
            self._changed.unpark_all()


@asynccontextmanager
async def _on_own_clock(
    gen: _Generation, on_failure: FailureHandler | None, deliver: Deliver | None
) -> AsyncIterator[AsyncIterator[EngineOutput]]:
    """``gen`` generating in a task of its own for the duration of the block.

    The block's exception, or its cancellation, comes out as itself, not wrapped in the
    nursery's exception group: the task never raises (it hands its fault to the reader), so the
    only thing the nursery can add is a ``Cancelled``.
    """
    pending = _Pending(gen.request.final_only, deliver)
    raised: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(gen.generate, pending, on_failure)
            outputs = pending.outputs()
            try:
                yield outputs
            except BaseException as exc:  # noqa: BLE001 - raised again below, as itself
                raised = exc
            finally:
                pending.deliver = None  # left: nothing more reaches the reader's run
                nursery.cancel_scope.cancel()
                await outputs.aclose()
    except BaseExceptionGroup as group:
        raised = raised or group.exceptions[0]
    if raised is not None:
        raise raised
