"""Mutation check for the property suite: does it catch these named defects? (``make mutants``)

For each mutant: copy ``src/`` to a temporary directory, apply the mutant's exact-text patches
(each ``old`` must occur exactly once, else the tool reports "patch did not apply" and fails: the
server code moved and the mutant must be updated), run ``pytest property_tests`` with that copy
first on ``PYTHONPATH`` and ``HYPOTHESIS_PROFILE=mutants``, and record which property killed it.
The property that killed a mutant before (its ``first``) runs alone first; only if it does not
kill it does the whole suite run (``--whole``: the whole suite at once, for every mutant).
An unmutated copy runs first and must pass. Prints a table; exits 1 if any mutant survived or
did not apply, or if the baseline failed. A mutant whose run fails without naming a failing test
(a runner error) is run once more before it is reported as an error.

    python tools/mutants.py [-j JOBS] [-k NAME_SUBSTRING] [--profile mutants] [--whole]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to src/braid
    patches: tuple[tuple[str, str], ...]
    what: str
    # The property that killed it last: run alone first, so that most mutants cost one test, not
    # the suite up to it. Only a kill counts: if it does not kill the mutant (a test renamed, a
    # property weakened), the whole suite runs as before.
    first: str = ""


# run_error_as_500: the views' non-streaming run (``routes.common.collect``), answering any failure with a 500.
OLD_RUN = (
    "    async with run:\n"
    "        while True:\n"
    "            try:\n"
    "                # A non-streaming run has no heartbeat, so its batches hold no ticks.\n"
    '                collector.feed(cast("list[Arrival]", await run.receive_ready()))\n'
    "            except trio.EndOfChannel:\n"
    "                break\n"
)
NEW_RUN = (
    "    try:\n"
    "        async with run:\n"
    "            while True:\n"
    "                try:\n"
    '                    collector.feed(cast("list[Arrival]", await run.receive_ready()))\n'
    "                except trio.EndOfChannel:\n"
    "                    break\n"
    "    except BraidError as err:\n"
    "        return JsonResponse(500, error_body(err))\n"
)

MUTANTS = [
    Mutant(
        "no_sibling_abort",
        "stream/run.py",
        (
            (
                "            failed = True\n            self.abort_all(err)\n\n        def seen(",
                "            failed = True\n            self.error = self.error or err\n\n        def seen(",
            ),
            (
                "                failed = True\n                self.abort_all(err)",
                "                failed = True\n                self.error = self.error or err",
            ),
        ),
        "an engine error is recorded but the sibling engine requests are not aborted",
        first="property_tests/test_scenarios.py::test_streams_follow_the_model",
    ),
    Mutant(
        "failure_noticed_on_next_read",
        "stream/run.py",
        (
            (
                "            failed = True\n            self.abort_all(err)\n\n        def seen(",
                "            failed = True\n\n        def seen(",
            ),
        ),
        "the engine's report of a failure is ignored: the batch is aborted only when the failing "
        "driver reads its next output (never, while the client reads nothing)",
        first="property_tests/test_scenarios.py::test_a_failure_aborts_the_batch_while_the_reader_is_stalled",
    ),
    Mutant(
        "no_abort_on_stall",
        "stream/run.py",
        (
            (
                "            except StreamStalled as err:\n                self.abort_all(err)",
                "            except StreamStalled as err:\n                self.error = self.error or err",
            ),
        ),
        "a stalled reader fails the run but its siblings keep generating",
        first="property_tests/test_scenarios.py::test_client_and_server_events_abort_the_batch",
    ),
    Mutant(
        "second_done",
        "stream/merge.py",
        (("        return self.done\n\n    def fail", "        return self.done + self.done\n\n    def fail"),),
        "a stream without usage ends with two [DONE]",
        first="property_tests/test_scenarios.py::test_streams_follow_the_model",
    ),
    Mutant(
        "usage_before_last_finish",
        "stream/merge.py",
        (
            (
                "    _opened: bool = attrs.field(init=False, default=False)\n",
                "    _opened: bool = attrs.field(init=False, default=False)\n"
                "    _usage_sent: bool = attrs.field(init=False, default=False)\n",
            ),
            (
                "                parts.append(chunk(c, usage))",
                "                parts.append(chunk(c, usage))\n"
                "                if self.plan.include_usage and c.finish_reason is not None and not self._usage_sent:\n"
                "                    self._usage_sent = True\n"
                "                    parts.append(self.events.usage(usage_of(self.plan, self.renderer)))",
            ),
            (
                "        if self.plan.include_usage:\n",
                "        if self.plan.include_usage and not self._usage_sent:\n",
            ),
        ),
        "the usage chunk is sent when the first choice finishes, not after the last",
        first="property_tests/test_scenarios.py::test_streams_follow_the_model",
    ),
    Mutant(
        "usage_on_error",
        "stream/merge.py",
        (
            (
                "        return self.events.error(err) + self.done",
                "        return self.events.usage(usage_of(self.plan, self.renderer)) + self.events.error(err) + self.done",
            ),
        ),
        "a failed stream sends a usage chunk before its error event",
        first="property_tests/test_dialects.py::test_an_engine_failure_ends_with_one_error",
    ),
    Mutant(
        "error_without_done",
        "stream/merge.py",
        (("        return self.events.error(err) + self.done", "        return self.events.error(err)"),),
        "an error event is not followed by [DONE]",
        first="property_tests/test_scenarios.py::test_streams_follow_the_model",
    ),
    Mutant(
        "index_prompt_plus_k",
        "stream/render.py",
        (("            index = prompt_idx * plan.n + delta.index", "            index = prompt_idx + delta.index"),),
        "choice index prompt_idx + k instead of prompt_idx * n + k",
        first="property_tests/test_scenarios.py::test_streams_follow_the_model",
    ),
    Mutant(
        "prompt_tokens_per_choice",
        "stream/plan.py",
        (
            (
                "        return sum(len(item.request.prompt_token_ids) for item in self.items)",
                "        return sum(len(item.request.prompt_token_ids) * self.n for item in self.items)",
            ),
        ),
        "usage counts each prompt's tokens once per choice",
        first="property_tests/test_scenarios.py::test_streams_follow_the_model",
    ),
    Mutant(
        "last_finish_reason_dropped",
        "stream/render.py",
        (
            (
                "                    finish_reason=finish_reason,\n",
                "                    finish_reason=None if self.all_finished else finish_reason,\n",
            ),
        ),
        "the finish_reason of the request's last chunk is dropped",
        first="property_tests/test_scenarios.py::test_streams_follow_the_model",
    ),
    Mutant(
        "continuous_usage_whole_batch",
        "stream/merge.py",
        (
            (
                "Usage(self._prompt_tokens[prompt_idx], c.completion_tokens, reasoning_tokens=c.reasoning_tokens)",
                "Usage(self.plan.prompt_tokens, c.completion_tokens, reasoning_tokens=c.reasoning_tokens)",
            ),
        ),
        "continuous usage reports the whole batch's prompt tokens on every chunk",
        first="property_tests/test_scenarios.py::test_streams_follow_the_model",
    ),
    Mutant(
        "echo_missing",
        "stream/render.py",
        (("                text = self.plan.items[prompt_idx].echo_text + text", "                text = text"),),
        "echo drops the prompt text from the first chunk",
        first="property_tests/test_scenarios.py::test_streams_follow_the_model",
    ),
    Mutant(
        "logprobs_offset_reset",
        "stream/render.py",
        (("offset=state.offset,", "offset=0,"),),
        "every chunk's text_offset restarts at 0",
        first="property_tests/test_scenarios.py::test_streams_follow_the_model",
    ),
    Mutant(
        "heartbeat_late",
        "stream/heartbeat.py",
        (
            ("if trio.current_time() < since + period:", "if trio.current_time() < since + period * 4:"),
            ("await trio.sleep_until(since + period)", "await trio.sleep_until(since + period * 4)"),
        ),
        "the heartbeat clock ticks four periods late",
        first="property_tests/test_scenarios.py::test_streams_follow_the_model",
    ),
    Mutant(
        "error_lost_at_end_of_channel",
        "stream/run.py",
        (("            raise self.error from None", "            return"),),
        "a run whose drivers all ended because of an error looks like a normal end",
        first="property_tests/test_dialects.py::test_an_engine_failure_ends_with_one_error",
    ),
    Mutant(
        "slot_leak_on_abort",
        "stream/run.py",
        (
            (
                "        try:\n            yield ending\n        finally:\n            hand_on()\n",
                "        yield ending\n        hand_on()\n",
            ),
            ("            if self.ticket is not None:\n                self.ticket.close()", "            pass"),
        ),
        "an aborted driver never hands its engine slots back (and the run does not close its ticket)",
        first="property_tests/test_scenarios.py::test_streams_follow_the_model",
    ),
    Mutant(
        "fifo_by_prompt",
        "stream/admit.py",
        (
            (
                "        adm._ring.append(self)\n",
                "        adm._ring.appendleft(self) if self.holds else adm._ring.append(self)\n",
            ),
        ),
        "a request that holds slots asks again ahead of the others: slots go first come first "
        "served by prompt, so a batch takes every freed slot until it is done",
        first="property_tests/test_admission_model.py::test_a_reserve_newcomer_passes_a_waiting_request_once",
    ),
    Mutant(
        "over_admission",
        "stream/admit.py",
        (
            (
                "        return cost <= (free - self.reserve if ticket.holds else free)",
                "        return cost <= (free - self.reserve if ticket.holds else free) + 1",
            ),
        ),
        "one engine request more than the server's slots is let into the engine",
        first="property_tests/test_admission_model.py::test_a_reserve_newcomer_passes_a_waiting_request_once",
    ),
    # Handing slots on before a prompt's end (Settings.handover_tokens): invariant 16.
    Mutant(
        "handover_at_first_token",
        "stream/run.py",
        (
            (
                "        ending = Ending(max(1, max_tokens - lead), hand_on) if lead and cost == 1 else None\n",
                "        ending = Ending(1, hand_on) if lead and cost == 1 else None\n",
            ),
        ),
        "a prompt hands its slots on at its first token, long before its end: the next one waits "
        "in the engine's queue for the whole of it",
        first="property_tests/test_scenarios.py::test_engine_failures_abort_the_batch",
    ),
    Mutant(
        "handover_at_open",
        "stream/run.py",
        (
            (
                "        try:\n            yield ending\n",
                "        try:\n            hand_on()\n            yield ending\n",
            ),
        ),
        "a prompt's slots are handed on as its engine request opens: the engine runs more requests "
        "than admission's slots",
        first="property_tests/test_scenarios.py::test_streams_follow_the_model",
    ),
    Mutant(
        "run_error_as_500",
        "routes/common.py",
        ((OLD_RUN, NEW_RUN),),
        "the view answers every failed non-streaming run with a 500, whatever its error",
        first="property_tests/test_scenarios.py::test_non_streaming_responses_follow_the_model",
    ),
    # Chat (braid.wire.chat_response's ChatEvents, braid.stream.merge's StreamMerger.feed, which sends
    # ChatEvents.opening on the first feed, and braid.wire.messages): the framing of role, echo and
    # content chunks, and chat's usage.
    Mutant(
        "chat_role_missing",
        "wire/chat_response.py",
        (
            (
                "            for k in range(n):\n                choice = {\n",
                "            for k in range(n - (i == len(self.prompts.token_ids) - 1)):\n                choice = {\n",
            ),
        ),
        "the last choice of a chat stream gets no role chunk",
        first="property_tests/test_scenarios.py::test_chat_streams_follow_the_model",
    ),
    Mutant(
        "chat_role_repeated",
        "stream/merge.py",
        (("            self._opened = True\n", "            pass\n"),),
        "every batch of outputs is preceded by the role (and echo) chunks again",
        first="property_tests/test_scenarios.py::test_chat_streams_follow_the_model",
    ),
    Mutant(
        "chat_role_after_content",
        "stream/merge.py",
        (
            ("        parts = []\n", '        parts = []\n        late = b""\n'),
            ("            parts.append(self.events.opening())\n", "            late = self.events.opening()\n"),
            ('        return b"".join(parts)\n', '        return b"".join(parts) + late\n'),
        ),
        "the role (and echo) chunks are sent after the first outputs' content chunks",
        first="property_tests/test_dialects.py::test_a_dialect_shows_the_chat_choice_streamed_and_whole",
    ),
    Mutant(
        "chat_echo_after_content",
        "wire/chat_response.py",
        (
            (
                "    _head: bytes = attrs.field(init=False)\n",
                '    _head: bytes = attrs.field(init=False)\n    _late: bytes = attrs.field(init=False, default=b"")\n',
            ),
            (
                "        for i, text in enumerate(shape.echo):\n",
                '        roles, parts = b"".join(parts), []\n        for i, text in enumerate(shape.echo):\n',
            ),
            ('        return b"".join(parts)\n', '        self._late = b"".join(parts)\n        return roles\n'),
            (
                "        return self._event(choice, usage)\n",
                '        late, self._late = self._late, b""\n        return self._event(choice, usage) + late\n',
            ),
        ),
        "the echo chunks are sent after the first content chunk (the roles still first)",
        first="property_tests/test_scenarios.py::test_chat_streams_follow_the_model",
    ),
    Mutant(
        "chat_prompt_tokens_per_choice",
        "wire/chat_response.py",
        (
            (
                "        return usage_event(self._head, usage)",
                "        return usage_event(self._head, attrs.evolve(usage, prompt_tokens=usage.prompt_tokens * self.prompts.n))",
            ),
            (
                '                "usage": usage.body(),',
                '                "usage": attrs.evolve(usage, prompt_tokens=usage.prompt_tokens * n).body(),',
            ),
        ),
        "chat usage (its stream's usage event and its body's) counts each conversation's prompt tokens once per choice",
        first="property_tests/test_scenarios.py::test_chat_streams_follow_the_model",
    ),
    Mutant(
        "chat_role_always_assistant",
        "wire/messages.py",
        (
            (
                '    return "assistant" if options.add_generation_prompt else messages[-1].role',
                '    return "assistant"',
            ),
        ),
        "a reply that continues the final message is given the assistant role, not that message's",
        first="property_tests/test_scenarios.py::test_chat_streams_follow_the_model",
    ),
    Mutant(
        "chat_echo_any_last_message",
        "wire/messages.py",
        (('    return last.content or "" if last.role == role else ""', '    return last.content or ""'),),
        "echo repeats the last message even when its role is not the reply's",
        first="property_tests/test_scenarios.py::test_chat_streams_follow_the_model",
    ),
    # Chat through tool-call and reasoning parsers (issue 26): I19-I21 of model/stream.py.
    Mutant(
        "parser_fed_merged_outputs",
        "stream/render.py",
        (
            (
                "                    parsed = parsing.take(index, finished=finish_reason is not None)\n",
                "                    parsing._choices[index].pending.append(\n"
                "                        parsing._choices[index].parser.feed(\n"
                "                            delta.text, delta.token_ids, finished=finish_reason is not None\n"
                "                        )\n"
                "                    )\n"
                "                    parsed = parsing.take(index, finished=finish_reason is not None)\n",
            ),
        ),
        "each choice's parser is fed the outputs its reader takes (several engine steps merged for "
        "a reader that lags), as vLLM's server feeds it, instead of the engine's steps",
        first="property_tests/test_dialects.py::test_a_dialect_shows_the_chat_choice_streamed_and_whole",
    ),
    Mutant(
        "parser_observer_off",
        "stream/parse.py",
        (
            (
                "        if not self.stream:\n            return None\n        base",
                "        if True:\n            return None\n        base",
            ),
        ),
        "the engine's steps never reach the parsers: a parsed stream shows nothing",
        first="property_tests/test_dialects.py::test_a_dialect_shows_the_chat_choice_streamed_and_whole",
    ),
    Mutant(
        "joined_call_keeps_last_fragment",
        "engine/tool_calls.py",
        (('                "".join(p.arguments for p in parts),', "                parts[-1].arguments,"),),
        "a lagging reader's joined delta keeps only the last argument fragment of each call",
        first="property_tests/test_dialects.py::test_a_dialect_shows_the_chat_choice_streamed_and_whole",
    ),
    Mutant(
        "no_tool_calls_finish",
        "stream/parse.py",
        (
            (
                '            return "tool_calls" if called and mode != "named" and reason == "stop" else reason',
                "            return reason",
            ),
        ),
        "a streamed choice that called a tool keeps the engine's finish_reason",
        first="property_tests/test_scenarios.py::test_parsed_chat_streams_follow_the_model",
    ),
    Mutant(
        "tool_calls_finish_when_cut",
        "stream/parse.py",
        (
            (
                '            return "tool_calls" if called and mode != "named" and reason == "stop" else reason',
                '            return "tool_calls" if called and mode != "named" else reason',
            ),
        ),
        "a streamed call cut by max_tokens finishes with tool_calls instead of length",
        first="property_tests/test_scenarios.py::test_parsed_chat_streams_follow_the_model",
    ),
    Mutant(
        "parallel_calls_not_filtered",
        "stream/parse.py",
        (("        if delta.tool_calls and not opts.tool_choice.parallel:", "        if False:"),),
        "parallel_tool_calls false still streams every call",
        first="property_tests/test_scenarios.py::test_parsed_calls_survive_any_split_of_the_stream",
    ),
    Mutant(
        "reasoning_not_hidden",
        "routes/chat.py",
        (
            (
                "        chat_template_kwargs=chat.chat_template_kwargs,\n        include_reasoning=chat.include_reasoning,",
                "        chat_template_kwargs=chat.chat_template_kwargs,\n        include_reasoning=True,",
            ),
            (
                "        chat.tool_choice,\n        include_reasoning=chat.include_reasoning,",
                "        chat.tool_choice,\n        include_reasoning=True,",
            ),
        ),
        "include_reasoning false is not passed on: the reasoning is still shown",
        first="property_tests/test_scenarios.py::test_parsed_chat_streams_follow_the_model",
    ),
    Mutant(
        "call_pieces_all_whole",
        "wire/chat_response.py",
        (("            if piece.id is not None or piece.name is not None\n", "            if True\n"),),
        "every piece of a streamed call repeats its id, type and name (null after the first)",
        first="property_tests/test_scenarios.py::test_parsed_chat_streams_follow_the_model",
    ),
    Mutant(
        "whole_response_drops_calls",
        "stream/parse.py",
        (("            tool_calls=calls,\n        )", "            tool_calls=(),\n        )"),),
        "a whole response's message loses its tool calls",
        first="property_tests/test_dialects.py::test_a_dialect_shows_the_chat_choice_streamed_and_whole",
    ),
    # Priority (issue 28): A2 and A3 of model/stream.py's check_server.
    Mutant(
        "priority_ignored",
        "stream/admit.py",
        (("        self.priority = priority\n", "        self.priority = 0\n"),),
        "a request's priority never reaches admission: every request waits in one ring",
        first="property_tests/test_admission_model.py::test_admission_alone_follows_the_server_rules",
    ),
    Mutant(
        "priority_reversed",
        "stream/admit.py",
        (("        return (self.background, self.priority)\n", "        return (self.background, -self.priority)\n"),),
        "admission serves the worst priority first",
        first="property_tests/test_admission_model.py::test_admission_alone_follows_the_server_rules",
    ),
    # The background class (issue 28): A4-A6 of model/stream.py's check_server.
    Mutant(
        "background_ignored",
        "stream/admit.py",
        (("        turning = background and not self.background\n", "        turning = False\n"),),
        "a request that asks for the background class (service_tier flex) is admitted as interactive",
        first="property_tests/test_admission_model.py::test_admission_alone_follows_the_server_rules",
    ),
    Mutant(
        "background_first",
        "stream/admit.py",
        (
            (
                "            for rank, ring in self._ring.levels():\n",
                "            for rank, ring in sorted(self._ring.levels(), key=lambda level: not level[0][0]):\n",
            ),
        ),
        "the background class's rings are served before the interactive ones",
        first="property_tests/test_admission_model.py::test_a_background_request_waits_while_an_interactive_one_is_held_back_by_the_reserve",
    ),
    Mutant(
        "background_passes_waiting",
        "stream/admit.py",
        (("                if background and passed:\n", "                if False:\n"),),
        "a background request takes slots an interactive request held back by the reserve cannot",
        first="property_tests/test_admission_model.py::test_a_background_request_waits_while_an_interactive_one_is_held_back_by_the_reserve",
    ),
    Mutant(
        "background_takes_reserve",
        "stream/admit.py",
        (
            (
                "            return cost <= free - self.reserve and self.background_in_use",
                "            return cost <= free and self.background_in_use",
            ),
        ),
        "a background request takes the slots kept for interactive newcomers",
        first="property_tests/test_admission_model.py::test_admission_alone_follows_the_server_rules",
    ),
    Mutant(
        "background_uncapped",
        "stream/admit.py",
        (
            (
                "self.background_in_use + cost <= self.background_room\n",
                "self.background_in_use + cost <= self.slots\n",
            ),
        ),
        "the background class is not held to --batch-max-slots",
        first="property_tests/test_admission_model.py::test_admission_alone_follows_the_server_rules",
    ),
    Mutant(
        "background_waits_for_idle",
        "stream/admit.py",
        (
            (
                "                if background and passed:\n",
                "                if background and (passed or self.in_use > self.background_in_use):\n",
            ),
        ),
        "a background request waits while any interactive request holds slots, not only while one waits",
        first="property_tests/test_admission_model.py::test_admission_alone_follows_the_server_rules",
    ),
    # The dialects' streams (model/dialects.py, property_tests/test_dialects.py).
    Mutant(
        "responses_sequence_repeats",
        "wire/responses_response.py",
        (("        self._seq += 1\n", ""),),
        "every Responses event has sequence_number 0 (R2)",
        first="property_tests/test_dialects.py::test_a_dialect_shows_the_chat_choice_streamed_and_whole",
    ),
    Mutant(
        "responses_call_item_not_closed",
        "wire/responses_response.py",
        (
            (
                ') + self._event("response.output_item.done", {"item": done, "output_index": index})',
                ")",
            ),
        ),
        "a function_call item is never closed with response.output_item.done (R4, R6)",
        first="property_tests/test_dialects.py::test_a_dialect_shows_the_chat_choice_streamed_and_whole",
    ),
    Mutant(
        "responses_error_before_opening",
        "routes/responses.py",
        (
            (
                "        if not self._opened:\n            self._opened = True\n            opening = self.events.opening()\n"
                "        return opening + self.events.error(err)",
                "        return opening + self.events.error(err)",
            ),
        ),
        "a Responses stream that fails before its first token is only an error event, without "
        "response.created (R3; vLLM's opens first)",
        first="property_tests/test_dialects.py::test_an_engine_failure_ends_with_one_error",
    ),
    Mutant(
        "messages_block_not_stopped",
        "wire/anthropic_response.py",
        (('        out += _event("content_block_stop", {"type": "content_block_stop", "index": self.index})\n', ""),),
        "content blocks are never closed with content_block_stop (M3)",
        first="property_tests/test_dialects.py::test_a_dialect_shows_the_chat_choice_streamed_and_whole",
    ),
    Mutant(
        "messages_no_message_delta",
        "wire/anthropic_response.py",
        (
            (
                '        return out + _event("message_stop", {"type": "message_stop"})',
                '        return _event("message_stop", {"type": "message_stop"})',
            ),
        ),
        "a Messages stream ends without message_delta (its stop reason and usage) (M2)",
        first="property_tests/test_dialects.py::test_a_dialect_shows_the_chat_choice_streamed_and_whole",
    ),
]


@dataclass
class Result:
    name: str
    status: str  # killed | survived | patch did not apply | baseline passed | baseline FAILED
    by: str
    seconds: float


_FAILED = re.compile(r"^FAILED (\S+?)(?: - |$)", re.M)
_INV = re.compile(r"\b(I\d+ [a-z_]+):")


def apply(mutant: Mutant, src: str) -> str | None:
    path = os.path.join(src, "braid", mutant.file)
    with open(path) as f:
        text = f.read()
    for old, new in mutant.patches:
        count = text.count(old)
        if count != 1:
            return f"{mutant.file}: expected 1 match, found {count}: {old.splitlines()[0].strip()!r}"
        text = text.replace(old, new)
    with open(path, "w") as f:
        f.write(text)
    return None


def _pytest(python: str, env: dict[str, str], targets: list[str]) -> tuple[int, str]:
    proc = subprocess.run(
        # native tracebacks: pytest's own rendering parses source with ast, which can hit
        # CPython 3.11's "AST constructor recursion depth mismatch" in a failed run
        [python, "-m", "pytest", *targets, "-x", "-q", "-p", "no:cacheprovider", "--tb=native"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return proc.returncode, proc.stdout + proc.stderr


def run_one(mutant: Mutant | None, profile: str, python: str, *, first: bool = True) -> Result:
    """Run the property suite against ``mutant`` (None: the baseline), its ``first`` property
    alone before the suite unless ``first`` is False."""
    name = mutant.name if mutant else "(baseline: no mutation)"
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="braid-mutant-") as tmp:
        src = os.path.join(tmp, "src")
        shutil.copytree(
            os.path.join(ROOT, "src", "braid"), os.path.join(src, "braid"), ignore=shutil.ignore_patterns("__pycache__")
        )
        if mutant is not None:
            problem = apply(mutant, src)
            if problem:
                return Result(name, "patch did not apply", problem, time.monotonic() - start)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([src, ROOT]),
            "HYPOTHESIS_PROFILE": profile,
            "BRAID_SRC_UNDER_TEST": src,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        rc, out = 0, ""
        if mutant is not None and mutant.first and first:
            rc, out = _pytest(python, env, [mutant.first])
        if rc != 1 or not _FAILED.search(out):  # not killed there: the whole suite
            rc, out = _pytest(python, env, ["property_tests"])
    took = time.monotonic() - start
    if mutant is None:
        status = "baseline passed" if rc == 0 else "baseline FAILED"
        return Result(name, status, "" if rc == 0 else out[-3000:], took)
    if rc == 0:
        return Result(name, "survived", "", took)
    tests = [t.split("::")[-1] for t in _FAILED.findall(out)]
    invariants = sorted(set(_INV.findall(out)))
    if not tests:  # not a property failure: collection error, crash of the runner, ...
        return Result(name, "error", out[-1500:], took)
    by = ", ".join(tests) + (f" [{'; '.join(invariants[:3])}]" if invariants else "")
    return Result(name, "killed", by, took)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("-k", default="", help="only mutants whose name contains this")
    ap.add_argument("--profile", default="mutants")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--whole", action="store_true", help="the whole suite for every mutant, no property first")
    args = ap.parse_args()
    chosen = [m for m in MUTANTS if args.k in m.name]
    base = run_one(None, args.profile, args.python)
    print(f"baseline: {base.status} in {base.seconds:.0f} s", flush=True)
    if base.status != "baseline passed":
        print(base.by)
        return 1
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda m: run_one(m, args.profile, args.python, first=not args.whole), chosen))
    # A run that failed without naming a failing test gets one more try, alone: CPython 3.11's
    # "AST constructor recursion depth mismatch" can break pytest's report of a real failure.
    for i, r in enumerate(results):
        if r.status == "error":
            print(f"{r.name}: the run reported no failing test; running it again", flush=True)
            results[i] = run_one(
                next(m for m in chosen if m.name == r.name), args.profile, args.python, first=not args.whole
            )
    w = max(len(r.name) for r in results)
    print(f"\n{'mutant'.ljust(w)}  {'result'.ljust(20)}  {'time':>5}  killed by")
    print(f"{'-' * w}  {'-' * 20}  {'-' * 5}  {'-' * 40}")
    for r in results:
        print(
            f"{r.name.ljust(w)}  {r.status.ljust(20)}  {r.seconds:4.0f}s  {r.by if r.status != 'error' else 'runner error'}"
        )
    for r in results:
        if r.status == "error":
            print(f"\n--- {r.name}: the property run did not report a failing test:\n{r.by}")
    bad = [r for r in results if r.status != "killed"]
    print(f"\n{len(results) - len(bad)} of {len(results)} mutants killed.")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
