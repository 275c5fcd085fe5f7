"""Delta rendering keeps every turn a prefix extension of the cached ids."""

from __future__ import annotations

import pytest

from radixchat.chat.conversation import ChatFormat, Conversation
from radixchat.chat.local import LocalBackend
from radixchat.engine import Engine, EngineConfig, SamplingParams


class TemplateTokenizer:
    """The real SmolLM2 tokenizer with another chat template (to exercise templates that rewrite)."""

    def __init__(self, tok, template: str) -> None:
        self._tok, self.chat_template = tok, template
        self.eos_token = tok.eos_token

    def apply_chat_template(self, *args, **kwargs):
        return self._tok.apply_chat_template(*args, **kwargs)

    def encode(self, *args, **kwargs):
        return self._tok.encode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        return self._tok.decode(*args, **kwargs)


def test_smollm2_template_supports_delta_rendering(smol_tokenizer):
    fmt = ChatFormat(smol_tokenizer)
    assert fmt.delta_ok, fmt.delta_problem


def test_new_turn_appends_only_the_delta(smol_tokenizer):
    fmt = ChatFormat(smol_tokenizer)
    conv = Conversation(fmt, system="Be brief.")
    first = conv.add_user("Hi")
    reply = smol_tokenizer.encode("Hello!", add_special_tokens=False) + [smol_tokenizer.eos_token_id]
    conv.add_assistant("Hello!", reply)
    second = conv.add_user("How are you?")
    assert second[: len(first) + len(reply)] == first + reply
    # ...and equals what one full rendering would give.
    full = smol_tokenizer.apply_chat_template(
        [m.template_dict() for m in conv.messages], add_generation_prompt=True, tokenize=False
    )
    assert second == smol_tokenizer.encode(full, add_special_tokens=False)
    assert conv.full_renders == 0


def test_truncated_reply_without_eos_still_extends(smol_tokenizer):
    conv = Conversation(ChatFormat(smol_tokenizer))
    first = conv.add_user("Tell me a story")
    partial = smol_tokenizer.encode("Once upon a", add_special_tokens=False)  # stopped early: no EOS
    conv.add_assistant("Once upon a", partial)
    second = conv.add_user("Go on")
    assert second[: len(first) + len(partial)] == first + partial and conv.full_renders == 0


def test_template_that_rewrites_history_falls_back_to_full_rendering(smol_tokenizer):
    # Renders only the last message: earlier turns disappear, so the old text is not a prefix any more.
    template = (
        "{{ '<|im_start|>' + messages[-1]['role'] + '\\n' + messages[-1]['content'] + '<|im_end|>\\n' }}"
    )
    fmt = ChatFormat(TemplateTokenizer(smol_tokenizer, template))
    conv = Conversation(fmt)
    conv.add_user("one")
    conv.add_assistant("ok", smol_tokenizer.encode("ok", add_special_tokens=False))
    ids = conv.add_user("two")
    assert conv.full_renders >= 1
    assert ids == smol_tokenizer.encode("<|im_start|>user\ntwo<|im_end|>\n", add_special_tokens=False)


def test_branch_shares_the_prefix(smol_tokenizer):
    conv = Conversation(ChatFormat(smol_tokenizer), system="S")
    conv.add_user("first question")
    conv.add_assistant("answer", smol_tokenizer.encode("answer", add_special_tokens=False) + [2])
    conv.add_user("second question")
    branch = conv.truncated(3)  # system, user, assistant
    edited = branch.add_user("a different second question")
    base = conv.truncated(3).ids
    assert edited[: len(base)] == base and conv.ids[: len(base)] == base
    assert len(conv.messages) == 4  # the original branch is untouched


@pytest.mark.real_model
async def test_each_turn_reuses_the_previous_turn(smol):
    engine = Engine(smol[0], EngineConfig(kv_pool_tokens=8192, debug=True))
    async with engine:
        backend = LocalBackend(engine)
        conv = backend.new_conversation(system="You are a helpful assistant.")
        prev = None
        for i, (question, max_tokens) in enumerate(
            [
                ("What is a prime number?", 40),
                ("Give an example.", 8),
                ("Why is 1 not prime?", 30),
                ("Thanks!", 20),
            ]
        ):
            conv.add_user(question)
            result = await backend.reply(conv, SamplingParams(max_tokens=max_tokens)).result()
            assert result.completion_tokens > 0
            if prev is not None:
                assert result.cached_tokens >= prev.prompt_tokens + prev.completion_tokens - 1, f"turn {i}"
            prev = result
        assert conv.full_renders == 0
        stats = engine.stats()
        assert stats.hit_rate > 0.5
    engine.core.check_integrity()


def test_a_special_token_inside_a_reply_keeps_the_delta(smol_tokenizer):
    conv = Conversation(ChatFormat(smol_tokenizer))
    first = conv.add_user("Hi")
    reply = (
        smol_tokenizer.encode("Hello", add_special_tokens=False)
        + [0]
        + smol_tokenizer.encode(" there", add_special_tokens=False)
        + [2]
    )
    conv.add_assistant("Hello<|endoftext|> there", reply)  # the text the engine streams for those ids
    second = conv.add_user("Go on")
    assert second[: len(first) + len(reply)] == first + reply and conv.full_renders == 0
