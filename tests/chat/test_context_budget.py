"""The context is a budget the conversation keeps: old turns leave it whole, the system prompt and the current
turn never do, a message that cannot fit is one clear error, and a reply after a drop is what transformers
gives on the kept history."""

from __future__ import annotations

import json

import pytest

from radixchat.chat.conversation import ChatFormat, ContextOverflowError, Conversation
from radixchat.chat.local import LocalBackend
from radixchat.chat.session import (
    SESSION_VERSION,
    conversation_from_session,
    load_session,
    save_session,
    session_from_conversation,
)
from radixchat.engine import Engine, EngineConfig, SamplingParams
from radixchat.engine.loader import describe_model
from tests.conftest import build_pair, hf_greedy, tiny_config


def _chat(tok, turns: int, words: int = 40) -> Conversation:
    """A conversation of ``turns`` answered turns (each about ``2 * words`` tokens), ending with a question."""
    conv = Conversation(ChatFormat(tok), system="You keep notes.")
    for i in range(turns):
        conv.add_user(f"Note {i}: " + " ".join(f"word{i}x{j}" for j in range(words // 2)))
        reply = f"Noted {i}: " + "ok " * (words // 2)
        conv.add_assistant(reply, tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id])
    conv.add_user("What was the first note?")
    return conv


def _render(conv: Conversation) -> list[int]:
    fmt = conv.fmt
    return fmt.encode(fmt.render(conv.active, add_generation_prompt=True))


def test_a_conversation_that_fits_is_left_alone(smol_tokenizer):
    conv = _chat(smol_tokenizer, 3)
    before = list(conv.ids)
    assert conv.fit_context(len(before) + 100, reserve=100) == 0
    assert conv.ids == before and not any(m.dropped for m in conv.messages)
    assert conv.fit_context(None, reserve=10**9) == 0  # no known context: nothing to do


def test_overflow_drops_the_oldest_whole_turns_down_to_about_half(smol_tokenizer):
    conv = _chat(smol_tokenizer, 12)
    size, n = len(conv.ids), len(conv.messages)
    context = size  # the next reply would not fit
    dropped = conv.fit_context(context, reserve=64)
    assert dropped >= 1 and conv.dropped_turns == dropped
    assert len(conv.messages) == n  # kept, marked
    assert conv.messages[0].role == "system" and not conv.messages[0].dropped
    gone = [m for m in conv.messages if m.dropped]
    assert gone == conv.messages[1 : 1 + 2 * dropped]  # the oldest, whole (question and answer)
    assert not conv.messages[-1].dropped and conv.messages[-1].content == "What was the first note?"
    assert len(conv.ids) <= context // 2 + 80  # about half, once: the next turns extend it again
    assert len(conv.ids) > context // 4
    assert conv.ids == _render(conv)  # what the model now sees: the template over the kept messages


def test_the_next_turn_after_a_drop_extends_the_kept_ids(smol_tokenizer):
    conv = _chat(smol_tokenizer, 12)
    conv.fit_context(len(conv.ids), reserve=64)
    kept = list(conv.ids)
    conv.add_assistant(
        "The first one.", smol_tokenizer.encode("The first one.", add_special_tokens=False) + [2]
    )
    nxt = conv.add_user("And the last?")
    assert nxt[: len(kept)] == kept and nxt == _render(conv)


def test_a_message_that_cannot_fit_even_alone_is_one_clear_error(smol_tokenizer):
    conv = _chat(smol_tokenizer, 4)
    conv.messages.pop()
    conv.add_user("word " * 3000)
    before = [(m.content, m.dropped, list(m.token_ids)) for m in conv.messages]
    with pytest.raises(ContextOverflowError) as info:
        conv.fit_context(2048, reserve=256)
    message = str(info.value)
    assert "\n" not in message and "2,048 tokens" in message and "3,0" in message  # its size and the context
    assert [(m.content, m.dropped, list(m.token_ids)) for m in conv.messages] == before  # nothing changed


def test_with_error_the_turn_is_refused_and_nothing_dropped(smol_tokenizer):
    conv = _chat(smol_tokenizer, 12)
    conv.context_overflow = "error"
    size = len(conv.ids)
    assert conv.fit_context(size + 10, reserve=64) == 0  # the prompt fits: the reply gets what is left
    with pytest.raises(ContextOverflowError, match="context_overflow is 'error'"):
        conv.fit_context(size, reserve=64)
    with pytest.raises(ContextOverflowError):  # the conversation's own setting wins over the backend's
        conv.fit_context(size, reserve=64, overflow="drop-oldest")
    assert conv.dropped_turns == 0 and not any(m.dropped for m in conv.messages)


def test_dropped_turns_are_kept_in_the_session_file(tmp_path, smol_tokenizer):
    conv = _chat(smol_tokenizer, 10)
    conv.fit_context(len(conv.ids), reserve=64)
    path = save_session(session_from_conversation(conv, name="long", model="m"), tmp_path / "long.json")
    assert json.loads(path.read_text())["version"] == SESSION_VERSION
    back = conversation_from_session(load_session(path), ChatFormat(smol_tokenizer), "m")
    assert [m.dropped for m in back.messages] == [m.dropped for m in conv.messages]
    assert [m.content for m in back.messages] == [m.content for m in conv.messages]
    back.add_assistant("Fine.", smol_tokenizer.encode("Fine.", add_special_tokens=False) + [2])
    assert back.add_user("Next?") == _render(back)  # the kept history only


def test_version_2_sessions_load_with_nothing_dropped(tmp_path):
    path = tmp_path / "v2.json"
    path.write_text(
        json.dumps(
            {"version": 2, "name": "v2", "model": "m", "messages": [{"role": "user", "content": "hi"}]}
        )
    )
    loaded = load_session(path)
    assert loaded.version == SESSION_VERSION and not loaded.messages[0].dropped


async def test_a_reply_after_a_drop_is_what_transformers_gives_on_the_kept_history(smol_tokenizer):
    """Equality after a drop: the engine over the kept history (its cache rebuilt) gives greedy tokens equal
    to transformers generate() on the same ids; the reply reports how many turns left."""
    cfg = tiny_config("llama")
    cfg.vocab_size = len(smol_tokenizer)  # the chat template's ids, special tokens included
    model, ref = build_pair(cfg)
    lm = describe_model(model, smol_tokenizer, "tiny-llama", ".")
    engine = Engine(lm, EngineConfig(kv_pool_tokens=700, debug=True))
    async with engine:
        backend = LocalBackend(engine)
        assert backend.context_tokens == 700
        conv = backend.new_conversation(system="You keep notes.")
        greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
        results = []
        for i in range(12):
            conv.add_user(f"Note {i}: " + " ".join(f"w{i}x{j}" for j in range(20)))
            results.append(await backend.reply(conv, greedy).result())
            if results[-1].dropped_turns:
                break
        last = results[-1]
        assert last.dropped_turns >= 1 and sum(r.dropped_turns for r in results) == conv.dropped_turns
        assert last.prompt_tokens <= 700 // 2 + 60
        prompt = [t for m in conv.active[:-1] for t in m.token_ids]
        assert conv.active[-1].token_ids == hf_greedy(ref, prompt, 24)
    engine.core.check_integrity()
