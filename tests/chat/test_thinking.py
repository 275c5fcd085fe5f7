"""Thinking models: the reasoning streams apart from the answer, history follows the template (Qwen3's
drops earlier turns' thinking), JSON mode constrains the answer after the thinking, and session files keep
the reasoning (older files migrate).

A tiny random Qwen3 with the default tokenizer plus ``<think>`` and ``</think>`` as tokens, and hand-written
templates: Qwen3's way (the generation prompt leaves the model to open the tag; ``reasoning_content`` of
earlier turns is dropped) and the R1 distills' (the generation prompt opens the tag).
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from transformers import AutoTokenizer

from radixchat.chat.backend import grammar_for
from radixchat.chat.conversation import ChatFormat, Conversation
from radixchat.chat.local import LocalBackend, LocalReply
from radixchat.chat.modes import ConstraintSpec
from radixchat.chat.session import (
    load_session,
    save_session,
    session_from_conversation,
)
from radixchat.chat.thinking import (
    ThinkingDelta,
    ThinkingSplitter,
    prompt_opens_thinking,
    split_thinking,
    template_thinks,
)
from radixchat.engine import Engine, EngineConfig, SamplingParams
from radixchat.engine.loader import describe_model
from radixchat.tool_format import tool_call_dicts
from tests.conftest import build_pair, tiny_config

QWEN3_STYLE = (
    "{%- set ns = namespace(last_query=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_query = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- set reasoning = m.reasoning_content if m.reasoning_content is defined and m.reasoning_content "
    "is not none else '' -%}"
    "{%- if loop.index0 > ns.last_query and reasoning -%}"
    "{{ '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>assistant\\n' + m.content + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- else -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
# R1 distills: the generation prompt opens the thinking; earlier answers are rendered after </think>.
R1_STYLE = (
    "{%- for m in messages -%}"
    "{%- set c = m.content -%}{%- if m.role == 'assistant' and '</think>' in c -%}"
    "{%- set c = c.split('</think>')[-1] -%}{%- endif -%}"
    "{{ '<|im_start|>' + m.role + '\\n' + c + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n<think>\\n' }}{%- endif -%}"
)


@pytest.fixture(scope="module")
def think_tokenizer(smol_dir):
    tok = AutoTokenizer.from_pretrained(smol_dir)
    tok.add_tokens(["<think>", "</think>"])
    return tok


@pytest.fixture(scope="module")
def think_model(think_tokenizer):
    config = tiny_config("qwen3")
    config.vocab_size = len(think_tokenizer)
    model, _ref = build_pair(config, seed=3)
    return model


def make_backend(model, tok, template: str, **kw) -> LocalBackend:
    tok.chat_template = template
    lm = describe_model(model, tok, "tiny-qwen3-think", ".")
    return LocalBackend(Engine(lm, EngineConfig(kv_pool_tokens=4096, debug=True)), **kw)


@pytest.fixture
async def qwen3(think_model, think_tokenizer):
    backend = make_backend(think_model, think_tokenizer, QWEN3_STYLE)
    await backend.start()
    yield backend
    await backend.aclose()
    backend.engine.core.check_integrity()


@pytest.fixture
async def r1(think_model, think_tokenizer):
    backend = make_backend(think_model, think_tokenizer, R1_STYLE, max_thinking_tokens=6)
    await backend.start()
    yield backend
    await backend.aclose()
    backend.engine.core.check_integrity()


class Forced:
    """A constraint that allows exactly ``ids``, one after another (the model's output, chosen)."""

    budget_limited = False

    def __init__(self, ids: list[int], vocab: int) -> None:
        self.ids, self.vocab, self.i = ids, vocab, 0

    def allowed(self, remaining=None):
        mask = torch.zeros(self.vocab, dtype=torch.bool)
        mask[self.ids[self.i]] = True
        return mask

    def advance(self, token_id: int) -> None:
        assert token_id == self.ids[self.i]
        self.i += 1

    def is_accepting(self) -> bool:
        return self.i >= len(self.ids)

    def is_terminated(self) -> bool:
        return self.i >= len(self.ids)


# -- the splitter --------------------------------------------------------------------------------------


def feed_all(splitter: ThinkingSplitter, chunks: list[str]) -> list[str]:
    out = [d for c in chunks for d in splitter.feed(c)]
    return out + splitter.flush()


def test_tags_split_over_chunks_are_found():
    text = "<think>\nFirst, 2 < 3.\n</think>\n\nThe answer is 3."
    for size in (1, 2, 3, 5):
        splitter = ThinkingSplitter()
        out = feed_all(splitter, [text[i : i + size] for i in range(0, len(text), size)])
        thinking = "".join(d for d in out if isinstance(d, ThinkingDelta))
        answer = "".join(d for d in out if not isinstance(d, ThinkingDelta))
        assert thinking.strip() == "First, 2 < 3." and answer == "The answer is 3."
        assert splitter.reasoning == "First, 2 < 3." and splitter.answer == "The answer is 3."


def test_a_prompt_that_opens_the_tag_starts_the_reply_inside_the_thinking():
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n")
    assert split_thinking("Hmm, easy.\n</think>\n\n42", inside=True) == ("Hmm, easy.", "42")
    assert split_thinking("Hmm, easy.\n</think>\n\n42") == (None, "Hmm, easy.\n</think>\n\n42")


def test_a_reply_without_tags_is_all_answer():
    splitter = ThinkingSplitter()
    out = feed_all(splitter, ["Hello", " <thi", "s is not a tag"])
    assert not any(isinstance(d, ThinkingDelta) for d in out)
    assert "".join(out) == "Hello <this is not a tag" and splitter.reasoning is None
    assert split_thinking("<thin") == (None, "<thin")  # a lone beginning of the tag is text after all
    assert split_thinking("<think>\n\n</think>\n\nHi") == (None, "Hi")  # thought nothing


def test_thinking_is_detected_from_the_template_or_the_vocabulary(smol_tokenizer, think_tokenizer):
    assert template_thinks(QWEN3_STYLE.replace("<think>", "").replace("</think>", ""), think_tokenizer)
    assert template_thinks(R1_STYLE, smol_tokenizer)
    assert not template_thinks(smol_tokenizer.chat_template, smol_tokenizer)


# -- local replies -------------------------------------------------------------------------------------


async def test_a_local_reply_streams_thinking_apart_and_counts_its_tokens(qwen3, think_tokenizer):
    tok = think_tokenizer
    conv = qwen3.new_conversation(system="Be brief.")
    prompt = conv.add_user("Hi?")
    thinking = tok.encode("<think>\nThey greet me.\n</think>\n\n", add_special_tokens=False)
    answer = tok.encode("Hello there!", add_special_tokens=False)
    forced = thinking + answer + [tok.convert_tokens_to_ids("<|im_end|>")]
    handle = qwen3.engine.submit(prompt, SamplingParams(max_tokens=64), Forced(forced, len(tok)))
    reply = LocalReply(qwen3, conv, handle, thinking=ThinkingSplitter(prompt_opens_thinking(conv.text)))
    deltas = [d async for d in reply]
    result = await reply.result()
    assert "".join(d for d in deltas if isinstance(d, ThinkingDelta)).strip() == "They greet me."
    assert "".join(d for d in deltas if not isinstance(d, ThinkingDelta)) == "Hello there!"
    msg = result.message
    assert (msg.content, msg.reasoning) == ("Hello there!", "They greet me.")
    assert msg.token_ids == forced  # the exact ids, thinking included: they are in the cache
    # "<think>" through "</think>": the newlines after the close tag belong to the answer's tokens.
    assert result.reasoning_tokens == thinking.index(tok.convert_tokens_to_ids("</think>")) + 1
    assert result.usage()["reasoning_tokens"] == result.reasoning_tokens
    assert f"thinking {result.reasoning_tokens} · answer " in result.footer()

    # History follows the template: Qwen3's drops the earlier turn's thinking, and the ids stay exact.
    renders = conv.full_renders
    nxt = conv.add_user("And now?")
    full = conv.fmt.render(conv.active, add_generation_prompt=True)
    assert "They greet me." not in full and "Hello there!" in full
    assert nxt == conv.fmt.encode(full) and conv.full_renders == renders + 1


def test_the_template_gets_the_reasoning_the_way_it_reads_it(think_tokenizer):
    think_tokenizer.chat_template = QWEN3_STYLE
    conv = Conversation(ChatFormat(think_tokenizer))
    conv.add_user("2+2?")
    conv.add_assistant("4", [], "stop", "Add them.")
    text = conv.fmt.render(conv.messages, add_generation_prompt=False)  # the current turn keeps it
    assert text.endswith("<|im_start|>assistant\n<think>\nAdd them.\n</think>\n\n4<|im_end|>\n")


async def test_json_mode_constrains_the_answer_after_unconstrained_thinking(r1, think_tokenizer):
    tok = think_tokenizer
    close = tok.convert_tokens_to_ids("</think>")
    params = SamplingParams(max_tokens=64, temperature=0.0)
    free = r1.new_conversation()
    free.add_user("Give me a number.")
    plain = await r1.reply(free, SamplingParams(max_tokens=6, temperature=0.0)).result()

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    conv = r1.new_conversation()
    conv.add_user("Give me a number.")
    constraint = await asyncio.to_thread(grammar_for, r1, ConstraintSpec("json", schema))
    result = await r1.reply(conv, params, constraint).result()
    ids = result.message.token_ids
    # The thinking is what the model writes unconstrained, until the cap (6) forces the close tag.
    assert ids[:6] == plain.message.token_ids[:6] and ids[6] == close
    assert result.reasoning_tokens == 7 and result.message.reasoning == plain.message.reasoning
    assert result.finish_reason == "stop"
    assert isinstance(json.loads(result.message.content)["n"], int)


async def test_tool_mode_constrains_the_call_after_the_thinking(r1, think_tokenizer):
    tool = {
        "name": "get_time",
        "description": "The time.",
        "parameters": {"type": "object", "properties": {}},
    }
    spec = ConstraintSpec("tool", tools=[tool], tool_choice="required")
    conv = r1.new_conversation()
    conv.add_user("What time is it?")
    constraint = await asyncio.to_thread(grammar_for, r1, spec)
    result = await r1.reply(conv, SamplingParams(max_tokens=64, temperature=0.0), constraint).result()
    assert result.message.token_ids[6] == think_tokenizer.convert_tokens_to_ids("</think>")
    assert result.reasoning_tokens == 7 and result.message.reasoning
    assert [c["name"] for c in tool_call_dicts(result.message.content)] == ["get_time"]


# -- session files ---------------------------------------------------------------------------------------


def test_sessions_keep_the_reasoning_and_old_files_migrate(think_tokenizer, tmp_path):
    think_tokenizer.chat_template = QWEN3_STYLE
    conv = Conversation(ChatFormat(think_tokenizer))
    conv.add_user("2+2?")
    conv.add_assistant("4", think_tokenizer.encode("<think>Add.</think>4"), "stop", "Add.")
    path = save_session(session_from_conversation(conv, name="t", model="m"), tmp_path / "t.json")
    loaded = load_session(path)
    assert (loaded.messages[-1].content, loaded.messages[-1].reasoning) == ("4", "Add.")
    assert loaded.messages[0].reasoning is None

    old = {
        "version": 3,
        "name": "old",
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "<think>\nThey greet.\n</think>\n\nHello!"},
        ],
        "branches": [{"label": "b", "messages": [{"role": "assistant", "content": "<think>x</think>y"}]}],
    }
    (tmp_path / "old.json").write_text(json.dumps(old))
    migrated = load_session(tmp_path / "old.json")
    assert (migrated.messages[1].content, migrated.messages[1].reasoning) == ("Hello!", "They greet.")
    assert (migrated.branches[0].messages[0].content, migrated.branches[0].messages[0].reasoning) == (
        "y",
        "x",
    )
    assert json.loads((tmp_path / "old.json").read_text()) == old  # never modified on load
