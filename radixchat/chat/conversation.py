"""Conversations: messages plus the exact token ids already in the engine's cache.

A new message appends only its *delta* — the chat template's text for the new message (and the
generation prompt) after the text the existing ids stand for — to the previous ids. History is never
re-tokenized, which is what keeps every turn a pure prefix extension (BPE merges across the boundary,
double BOS, or templates that rewrite earlier turns would otherwise break the match). Where the template
does not render the history as a prefix of the new text (it trims or rewrites earlier turns), or the
start-up probe finds that delta tokenization disagrees with full tokenization for this tokenizer, we fall
back to rendering and tokenizing the whole conversation; the radix tree still reuses the longest match.

The model's context is a budget the conversation keeps (``fit_context``): when the next reply would not fit,
the oldest whole turns after the system prompt leave the context, enough of them at once to bring it down to
about half, so that the cache is rebuilt once per drop rather than at every turn. They stay in ``messages``
(on screen and in session files) marked ``dropped``; the model no longer sees them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from radixchat.chat.templates import choose_template
from radixchat.chat.thinking import template_thinks
from radixchat.errors import RadixchatError
from radixchat.tool_format import strip_tool_calls

Role = Literal["system", "user", "assistant", "tool"]
ContextOverflow = Literal["drop-oldest", "error"]
CONTEXT_OVERFLOW: tuple[str, ...] = ("drop-oldest", "error")


# For templates that know nothing of tools (SmolLM2's): the declarations go into the system message.
GENERIC_TOOLS_HEADER = (
    "# Tools\n\nYou can call these tools. To call one, reply with only\n"
    '<tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}</tool_call>\n'
    "and nothing else; the result comes back in a message from the tool. Otherwise answer normally.\n"
)


def generic_tools_text(tools: list[dict]) -> str:
    lines = [GENERIC_TOOLS_HEADER]
    for t in tools:
        params = json.dumps(t.get("parameters", {}), ensure_ascii=False, separators=(",", ":"))
        lines.append(f"- {t['name']}: {t.get('description', '')} Arguments (JSON Schema): {params}")
    return "\n".join(lines)


class ChatTemplateError(RadixchatError):
    """The model's chat template cannot render these messages."""


class ContextOverflowError(RadixchatError):
    """The conversation's next prompt cannot fit the model's context."""


@dataclass(slots=True)
class Message:
    role: Role
    content: str
    # This message's share of the exact cached sequence: for a user/tool message, the rendered delta
    # (template wrapping plus the generation prompt); for an assistant message, the generated ids.
    token_ids: list[int] = field(default_factory=list)
    rendered: str = ""  # the text those ids stand for
    finish_reason: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    name: str | None = None  # tool name, for tool messages
    meta: dict[str, Any] = field(default_factory=dict)  # usage and timings of an assistant turn
    dropped: bool = False  # left the model's context (``Conversation.fit_context``): kept, not rendered
    reasoning: str | None = None  # an assistant's thinking (``chat.thinking``); ``content`` is its answer

    def template_dict(self, native_tools: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning is not None:
            # As Qwen3's template reads it (it drops earlier turns' thinking); others ignore the key.
            out["reasoning_content"] = self.reasoning
        if self.tool_calls and native_tools:
            # The template writes the calls itself; the content keeps only the text around them.
            out["content"] = strip_tool_calls(self.content)
            out["tool_calls"] = [{"type": "function", "function": c} for c in self.tool_calls]
        if self.name:
            out["name"] = self.name
        return out


class ChatFormat:
    """Renders messages with one tokenizer's chat template and checks delta rendering at start-up.

    ``template`` is "auto" (the model's own, else a built-in chosen for it: ``templates.choose_template``),
    a built-in's name or a Jinja file. ``stop_ids`` are the ids that end a reply (the engine's EOS set;
    default: the tokenizer's EOS). Where the tokenizer puts BOS before text of its own accord
    (``add_bos_token``, as Gemma's and Llama's do) and the template does not write it, BOS opens every
    rendering, as llama.cpp does."""

    def __init__(
        self,
        tokenizer: Any,
        template: str = "auto",
        model_type: str | None = None,
        stop_ids: Iterable[int] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        choice = choose_template(tokenizer, model_type, template)
        self.template, self.template_name, self.notice = choice.text, choice.name, choice.notice
        if stop_ids is None:  # the tokenizer's EOS, when it is one token
            eos = getattr(tokenizer, "eos_token", None)
            stop_ids = self.encode(eos) if isinstance(eos, str) and eos else []
            stop_ids = stop_ids if len(stop_ids) == 1 else []
        self.stop_ids = frozenset(stop_ids)
        self.bos = ""  # what _bos_prefix's probe rendering starts from
        self.bos = self._bos_prefix()
        self.native_tools = self._supports_tools()
        self.thinks = template_thinks(self.template, tokenizer)  # replies may think (``chat.thinking``)
        self.delta_ok, self.delta_problem = self._probe()

    def render(
        self, messages: list[Message], add_generation_prompt: bool, tools: list[dict] | None = None
    ) -> str:
        """The template's text. Tools go to the template when it supports them (``tools=``), else into
        the system message in the documented generic format (``generic_tools_text``)."""
        dicts = [m.template_dict(self.native_tools) for m in messages]
        if tools and not self.native_tools:
            block = generic_tools_text(tools)
            if dicts and dicts[0]["role"] == "system":
                dicts[0] = {**dicts[0], "content": f"{dicts[0]['content']}\n\n{block}"}
            else:
                dicts.insert(0, {"role": "system", "content": block})
        native = [{"type": "function", "function": t} for t in tools] if tools and self.native_tools else None
        return self._apply(dicts, add_generation_prompt, native)

    def _apply(self, dicts: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                dicts,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                chat_template=self.template,
            )
        except Exception as exc:
            raise ChatTemplateError(f"the chat template cannot render this conversation: {exc}") from None
        return self.bos + text

    def _bos_prefix(self) -> str:
        """BOS's text when the tokenizer adds BOS to text by itself and the template does not write it."""
        bos, bos_id = (
            getattr(self.tokenizer, "bos_token", None),
            getattr(self.tokenizer, "bos_token_id", None),
        )
        if not isinstance(bos, str) or not bos or not isinstance(bos_id, int):
            return ""
        adds = getattr(self.tokenizer, "add_bos_token", None)
        if adds is None or adds is False:
            try:  # the tokenizer's post-processor may add it (tokenizers' TemplateProcessing)
                adds = list(self.tokenizer("a").input_ids[:1]) == [bos_id]
            except Exception:
                adds = False
        if not adds:
            return ""
        try:
            probe = self._apply([{"role": "user", "content": "hi"}], True)
        except ChatTemplateError:
            return ""
        return "" if probe.startswith(bos) else bos

    def _supports_tools(self) -> bool:
        """Whether the template renders a ``tools=`` argument at all (SmolLM2's ignores it)."""
        probe = [{"role": "user", "content": "hi"}]
        tool = {
            "type": "function",
            "function": {"name": "probe_tool_xyz", "description": "d", "parameters": {}},
        }
        try:
            return "probe_tool_xyz" in self._apply(probe, True, [tool])
        except ChatTemplateError:
            return False

    def encode(self, text: str) -> list[int]:
        # The template's text already carries BOS and other special tokens, so never add them again.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _probe(self) -> tuple[bool, str | None]:
        """Build a short conversation by deltas and compare it with one full rendering."""
        try:
            conv = Conversation(self, system="You are a test.", _probe=True)
            conv.add_user("Hello there, how are you?")
            reply = "I am fine. Ünïcode, code: `x = [1, 2]`."
            ids = self.encode(reply)
            full = self.render(conv.messages + [Message("assistant", reply)], add_generation_prompt=False)
            end = full[len(conv.text) + len(reply) :]
            head = self.encode(end)[:1]
            if head and head[0] in self.stop_ids:
                ids += head  # the model ends its turn with this token
            conv.add_assistant(reply, ids)
            probe = conv.add_user("And the weather?")
            expect = self.encode(self.render(conv.messages, add_generation_prompt=True))
        except Exception as exc:  # a template that cannot even render the probe: always re-render
            return False, f"probe failed: {exc}"
        if probe != expect:
            return False, "delta tokenization differs from full tokenization"
        return True, None


class Conversation:
    """Messages and their exact token ids. Not thread-safe; owned by one front end."""

    def __init__(
        self,
        fmt: ChatFormat,
        system: str | None = None,
        tools: list[dict] | None = None,
        messages: list[Message] | None = None,
        _probe: bool = False,
    ) -> None:
        self.fmt = fmt
        self.tools = tools
        self.messages: list[Message] = list(messages or [])
        self.full_renders = 0  # turns that could not use the delta (for tests and stats)
        # What ``fit_context`` does when the next prompt and its reply would not fit the model's context
        # (None: the backend's setting).
        self.context_overflow: ContextOverflow | None = None
        self._use_delta = _probe or fmt.delta_ok
        if system is not None and not self.messages:
            self.messages.append(Message("system", system))

    @property
    def ids(self) -> list[int]:
        return [t for m in self.messages if not m.dropped for t in m.token_ids]

    @property
    def text(self) -> str:
        return "".join(m.rendered for m in self.messages if not m.dropped)

    @property
    def active(self) -> list[Message]:
        """The messages the model sees (all but those that left the context)."""
        return [m for m in self.messages if not m.dropped]

    @property
    def dropped_turns(self) -> int:
        """User turns that have left the context."""
        return sum(1 for m in self.messages if m.dropped and m.role == "user")

    @property
    def system(self) -> str | None:
        return self.messages[0].content if self.messages and self.messages[0].role == "system" else None

    def add_user(self, content: str) -> list[int]:
        """Append a user message; return the prompt ids to generate the reply from."""
        return self._append_and_render(Message("user", content))

    def add_tool_result(self, name: str, content: str) -> list[int]:
        return self._append_and_render(Message("tool", content, name=name))

    def prompt_ids(self) -> list[int]:
        """Ids to (re)generate the reply to the last message (e.g. after dropping a reply)."""
        if not self.messages or self.messages[-1].role not in ("user", "tool"):
            raise ChatTemplateError("nothing to reply to: the conversation does not end with a user message")
        return self.ids

    def add_assistant(
        self,
        content: str,
        token_ids: list[int],
        finish_reason: str | None = None,
        reasoning: str | None = None,
        **meta: Any,
    ) -> None:
        """Record a reply (its answer, and its thinking apart) with the exact ids the engine generated
        (they are in its cache now, thinking included)."""
        msg = Message(
            "assistant",
            content,
            list(token_ids),
            self.fmt.decode(list(token_ids)),
            finish_reason=finish_reason,
            reasoning=reasoning,
        )
        msg.meta.update(meta)
        self.messages.append(msg)

    def _append_and_render(self, msg: Message) -> list[int]:
        before = self.text
        self.messages.append(msg)
        full = self.fmt.render(self.active, add_generation_prompt=True, tools=self.tools)
        if self._use_delta and full.startswith(before):
            msg.rendered = full[len(before) :]
            msg.token_ids = self.fmt.encode(msg.rendered)
        else:
            self._render_all(full)
        return self.ids

    def _render_all(self, full: str | None = None) -> None:
        """Re-render the whole active conversation into its last message; earlier messages keep their
        text but lose their ids (the cache then finds what it can of the new ids)."""
        self.full_renders += 1
        if full is None:
            full = self.fmt.render(self.active, add_generation_prompt=True, tools=self.tools)
        for m in self.messages:
            m.token_ids, m.rendered = [], ""
        last = self.active[-1]
        last.rendered = full
        last.token_ids = self.fmt.encode(full)

    # -- the context budget -------------------------------------------------------------------------------

    def fit_context(
        self, context: int | None, reserve: int = 0, overflow: ContextOverflow = "drop-oldest"
    ) -> int:
        """Make the prompt (``ids``) and ``reserve`` tokens of reply fit ``context`` tokens; returns how many
        turns left the context now (0: it fitted). None: no known context, nothing to do.

        With ``drop-oldest``, the oldest whole turns after the system prompt leave, never the system prompt
        and never the current turn (the last user message and what follows it), until the prompt is about
        half the context. Raises ContextOverflowError, changing nothing, when the prompt cannot fit even
        then (or at all, with ``error``). ``overflow`` applies unless the conversation sets its own."""
        if context is None:
            return 0
        size = len(self.ids)
        if size + reserve <= context:
            return 0
        overflow = self.context_overflow or overflow
        turns = self._droppable_turns() if overflow == "drop-oldest" else []
        if size < context and not turns:
            return 0  # the prompt fits; the reply gets what is left (and ends "length" if it runs out)
        kept = size
        chosen: list[list[Message]] = []
        for turn in turns:
            if kept <= context // 2:
                break
            chosen.append(turn)
            kept -= sum(self._size(m) for m in turn)
        if chosen and any(not m.token_ids for turn in chosen for m in turn):
            kept = self._measure(chosen)  # a full render holds their ids elsewhere: count exactly
        if kept >= context:
            if overflow == "error":
                raise ContextOverflowError(
                    f"the conversation ({size:,} tokens) no longer fits the model's context of {context:,} "
                    "tokens (context_overflow is 'error')"
                )
            message = self._message_tokens(self._current_turn())
            raise ContextOverflowError(
                f"the message ({message:,} tokens; {kept:,} with the system prompt) does not fit the "
                f"model's context of {context:,} tokens"
            )
        if not chosen:
            return 0
        for turn in chosen:
            for m in turn:
                m.dropped = True
        self._render_all()
        return len(chosen)

    def _current_turn(self) -> list[Message]:
        last_user = max(
            (i for i, m in enumerate(self.messages) if m.role == "user"), default=len(self.messages)
        )
        return self.messages[last_user:]

    def _droppable_turns(self) -> list[list[Message]]:
        """Whole turns (a user message and what answers it) between the system prompt and the current
        turn, oldest first."""
        current = self._current_turn()
        start = 1 if self.messages and self.messages[0].role == "system" else 0
        body = [m for m in self.messages[start : len(self.messages) - len(current)] if not m.dropped]
        turns: list[list[Message]] = []
        for m in body:
            if m.role == "user" or not turns:
                turns.append([m])
            else:
                turns[-1].append(m)
        return turns

    def _measure(self, without: list[list[Message]]) -> int:
        gone = {id(m) for turn in without for m in turn}
        kept = [m for m in self.active if id(m) not in gone]
        return len(self.fmt.encode(self.fmt.render(kept, add_generation_prompt=True, tools=self.tools)))

    def _size(self, m: Message) -> int:
        """A message's share of ``ids`` (estimated from its text after a full render took its ids)."""
        return len(m.token_ids) if m.token_ids else len(self.fmt.encode(m.content)) + 4

    def _message_tokens(self, messages: list[Message]) -> int:
        return sum(len(self.fmt.encode(m.content)) for m in messages)

    def truncated(self, n_messages: int) -> Conversation:
        """A copy holding the first ``n_messages`` messages: a branch sharing the cached prefix."""
        conv = Conversation(self.fmt, tools=self.tools, messages=copy.deepcopy(self.messages[:n_messages]))
        conv.context_overflow = self.context_overflow
        return conv
