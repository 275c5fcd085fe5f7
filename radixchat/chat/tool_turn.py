"""One user turn in tool mode: the model answers or calls tools; results go back as tool messages and
the model continues, up to ``max_rounds`` rounds, all inside the cached conversation (each tool result is
a delta like any other turn, so every round reuses everything before it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from radixchat.chat.backend import ChatBackend, Reply, TurnResult, grammar_for
from radixchat.chat.conversation import Conversation
from radixchat.chat.modes import ConstraintSpec
from radixchat.chat.tools import Consent, Tool, ToolCallRecord, ToolContext, ToolRegistry
from radixchat.sampling import SamplingParams
from radixchat.tool_format import TOOL_CLOSE, TOOL_OPEN, strip_tool_calls, tool_call_dicts


@dataclass
class ToolTurn:
    final: TurnResult  # the reply that ended the turn (text, or the last call if it was cut short)
    rounds: list[TurnResult] = field(default_factory=list)  # every reply of the turn, in order
    calls: list[ToolCallRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the turn dropped (a cut call, repeats)

    @property
    def text(self) -> str:
        """The final reply's text without any tool-call blocks."""
        return strip_tool_calls(self.final.message.content)

    @property
    def reasoning(self) -> str | None:
        """The thinking of every round, in order (None: no round thought)."""
        parts = [r.message.reasoning for r in self.rounds if r.message.reasoning]
        return "\n\n".join(parts) if parts else None

    def usage(self) -> dict[str, int]:
        """Prompt and cached tokens of the first round (what the user's message cost) plus all output
        (and the thinking of it, where a round thought)."""
        first = self.rounds[0]
        out = {
            "prompt_tokens": first.prompt_tokens,
            "cached_tokens": first.cached_tokens,
            "completion_tokens": sum(r.completion_tokens for r in self.rounds),
        }
        thought = [r.reasoning_tokens for r in self.rounds if r.reasoning_tokens is not None]
        if thought:
            out["reasoning_tokens"] = sum(thought)
        return out


async def _collect(reply: Reply) -> TurnResult:
    return await reply.result()


async def run_tool_turn(
    backend: ChatBackend,
    conv: Conversation,
    user_text: str | None,
    params: SamplingParams,
    tools: list[Tool],
    registry: ToolRegistry,
    ctx: ToolContext,
    consent: Consent,
    *,
    tool_choice: str | dict = "auto",
    max_rounds: int = 4,
    max_calls: int = 1,
    on_reply: Callable[[Reply], Awaitable[TurnResult]] = _collect,
    on_call: Callable[[ToolCallRecord], None] | None = None,
    should_continue: Callable[[], bool] | None = None,
) -> ToolTurn:
    """Add ``user_text`` (None: the conversation already ends with the user's message) and run the turn.

    ``tool_choice`` applies to the first round (later rounds are ``auto`` so the model can answer with
    the results); after ``max_rounds`` rounds of calls one last round with ``none`` forces a text answer.
    ``should_continue`` is asked before every round after the first (a UI's stop button): when it says
    no, the turn ends with the tool results appended and no further reply.
    """
    decls = [t.declaration() for t in tools]  # what the prompt shows
    grammar_decls = [t.schema() for t in tools]  # what the grammar enforces
    if conv.tools != decls:
        # The declarations are part of the rendered prompt: the user's message must come after them.
        conv.tools = decls
        if user_text is None:
            last = conv.messages.pop()
            if last.role != "user":
                raise ValueError("the conversation must end with the user's message")
            user_text = last.content
    if user_text is not None:
        conv.add_user(user_text)
    choice: str | dict = tool_choice
    turn: ToolTurn | None = None
    for round_no in range(max_rounds + 1):
        if round_no and should_continue is not None and not should_continue():
            break
        if round_no == max_rounds:
            choice = "none"
        spec = ConstraintSpec("tool", tools=grammar_decls, tool_choice=choice, max_calls=max_calls)
        grammar = await asyncio.to_thread(grammar_for, backend, spec)
        result = await on_reply(backend.reply(conv, params, grammar))
        if turn is None:
            turn = ToolTurn(result)
        turn.final = result
        turn.rounds.append(result)
        # A remote backend reports calls itself; for the local engine they are in the constrained text.
        calls = result.message.tool_calls
        if calls is None:
            calls = tool_call_dicts(result.message.content)
        if result.finish_reason != "stop":
            # Cut short (length): the complete blocks still run; the cut one is never run (it is not a
            # complete block, so parsing left it out). Cancelled or failed replies run nothing.
            if result.finish_reason != "length" or not calls:
                break
            # A server reports the cut call too, with arguments that stop mid-JSON: drop it as well.
            whole = [c for c in calls if not _cut_short(c)]
            if len(whole) < len(calls) or TOOL_OPEN in result.message.content.rsplit(TOOL_CLOSE, 1)[-1]:
                turn.notes.append("the reply was cut short inside a tool call; that call was dropped")
            calls = whole
            if not calls:
                break
        if not calls:
            break
        result.message.tool_calls = calls
        seen: dict[str, ToolCallRecord] = {}
        for call in calls:
            key = json.dumps([call["name"], call["arguments"]], sort_keys=True)
            if key in seen:  # identical calls in one round run once
                turn.notes.append(f"an identical {call['name']} call in the same reply ran once")
                continue
            record = await registry.call(call["name"], call["arguments"], ctx, consent)
            seen[key] = record
            turn.calls.append(record)
            if on_call is not None:
                on_call(record)
            conv.add_tool_result(record.name, record.message_content())
        if result.finish_reason != "stop":
            break  # a cut-short reply's calls ran; the turn ends with their results
        if choice != "none":
            choice = "auto"
    assert turn is not None
    return turn


def _cut_short(call: dict) -> bool:
    """A call whose arguments are JSON text that does not parse (a server's call cut by max_tokens)."""
    args = call.get("arguments")
    if not isinstance(args, str):
        return False
    try:
        json.loads(args)
    except ValueError:
        return True
    return False
