"""Chat formats as llama.cpp handles them: the model's own template, else a built-in chosen by the tokenizer's
special tokens and the architecture (with a notice), ``--chat-template NAME|FILE``, BOS where the tokenizer
adds it, and every end-of-turn token of the template stopping a reply."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from radixchat.chat.conversation import ChatFormat, Conversation
from radixchat.chat.templates import BUILTIN, ChatTemplateChoiceError, choose_template
from radixchat.config import Settings
from radixchat.engine.loader import eos_ids_of
from radixchat.errors import ConfigError
from tests.conftest import build_pair, tiny_config


def without_template(tok, special: list[str] | None = None, chatml: bool = True):
    """The SmolLM2 tokenizer as a base model's would be: no chat template, maybe other special tokens, and
    without ChatML's (``chatml=False``: another family's tokenizer has none)."""
    out = copy.deepcopy(tok)
    out.chat_template = None
    if special:
        out.add_special_tokens({"additional_special_tokens": special})
    if not chatml:
        vocab = out.get_vocab()
        out.get_vocab = lambda: {k: v for k, v in vocab.items() if not k.startswith("<|im_")}
    return out


@pytest.mark.parametrize(
    ("special", "model_type", "expected"),
    [
        (["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], "llama", "llama3"),
        (["<|user|>", "<|assistant|>", "<|end|>"], "phi3", "phi3"),
        (["[INST]", "[/INST]"], "llama", "mistral"),
        ([], "qwen2", "qwen"),  # SmolLM2's tokenizer has <|im_start|>: ChatML, and Qwen's on a Qwen model
        ([], "llama", "chatml"),
    ],
)
def test_a_base_model_gets_the_builtin_its_tokenizer_names(smol_tokenizer, special, model_type, expected):
    choice = choose_template(without_template(smol_tokenizer, special, chatml=not special), model_type)
    assert choice.name == expected and choice.text == BUILTIN[expected]
    assert f"'{expected}'" in choice.notice and "--chat-template" in choice.notice
    assert "\n" not in choice.notice


def test_the_architecture_decides_when_the_tokenizer_has_no_chat_tokens(smol_tokenizer):
    bare = without_template(smol_tokenizer, chatml=False)
    assert choose_template(bare, "gemma3_text").name == "gemma"
    assert choose_template(bare, "mistral").name == "mistral"
    fallback = choose_template(bare, "llama")
    assert fallback.name == "chatml" and "plain text" in fallback.notice


def test_the_models_own_template_wins_without_a_notice(smol_tokenizer):
    choice = choose_template(smol_tokenizer, "llama")
    assert choice.name == "model" and choice.notice is None
    assert choose_template(smol_tokenizer, "llama", "gemma").name == "gemma"  # unless one is asked for


def test_a_template_file_is_read_and_a_bad_name_is_one_clear_error(smol_tokenizer, tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}")
    fmt = ChatFormat(smol_tokenizer, str(path))
    assert fmt.template_name == str(path)
    assert fmt.render(Conversation(fmt, system="S").messages, False) == "<<S>>"
    with pytest.raises(ChatTemplateChoiceError, match="neither a built-in"):
        choose_template(smol_tokenizer, None, str(tmp_path / "missing.jinja"))
    with pytest.raises(ConfigError, match="chat_template"):
        Settings.load({"chat_template": "gemma2"})
    run = subprocess.run(
        [sys.executable, "-m", "radixchat", "--chat-template", "nope", "-p", "hi"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert (
        "chat_template" in run.stderr and "nope" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    )


@pytest.mark.gemma
def test_gemma_renders_its_own_format_with_one_bos(gemma_tokenizer):
    fmt = ChatFormat(gemma_tokenizer, model_type="gemma3_text")
    assert fmt.template_name == "gemma" and fmt.delta_ok, fmt.delta_problem
    conv = Conversation(fmt, system="Be brief.")
    conv.add_user("Hi")
    end = gemma_tokenizer.convert_tokens_to_ids("<end_of_turn>")
    conv.add_assistant("Hello!", gemma_tokenizer.encode("Hello!", add_special_tokens=False) + [end])
    ids = conv.add_user("Bye")
    assert conv.text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )
    # Delta by delta, the ids are exactly a full rendering's, with BOS once at the start.
    assert ids == gemma_tokenizer.encode(conv.text, add_special_tokens=False)
    assert ids[0] == gemma_tokenizer.bos_token_id and ids[1] != gemma_tokenizer.bos_token_id


@pytest.mark.gemma
def test_bos_is_added_where_the_tokenizer_adds_it_and_the_template_does_not(gemma_tokenizer, smol_tokenizer):
    chatml_on_gemma = ChatFormat(gemma_tokenizer, "chatml")
    assert chatml_on_gemma.bos == "<bos>"
    conv = Conversation(chatml_on_gemma)
    assert conv.add_user("Hi")[0] == gemma_tokenizer.bos_token_id
    assert ChatFormat(smol_tokenizer).bos == ""  # SmolLM2's tokenizer adds none


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_builtin_renders_a_conversation_as_a_prefix_chain(smol_tokenizer, name):
    """Each built-in renders system, user, assistant and tool turns, and the history stays a prefix of
    the next rendering (what delta rendering and the radix cache rely on)."""
    fmt = ChatFormat(without_template(smol_tokenizer), name)
    conv = Conversation(fmt, system="System text.")
    conv.add_user("First question")
    before = fmt.render(conv.messages, add_generation_prompt=True)
    assert "System text." in before and "First question" in before
    conv.add_assistant("An answer", smol_tokenizer.encode("An answer", add_special_tokens=False))
    conv.add_tool_result("calculator", '{"result": 4}')
    after = fmt.render(conv.messages, add_generation_prompt=True)
    assert after.startswith(before) and "An answer" in after and '{"result": 4}' in after


@pytest.mark.gemma
def test_end_of_turn_tokens_and_every_generation_eos_stop(smol_tokenizer, gemma_tokenizer):
    model, _ = build_pair(tiny_config("llama"))
    model.generation_config.eos_token_id = [5, 7]
    assert {5, 7} <= eos_ids_of(model, smol_tokenizer)
    llama3 = without_template(smol_tokenizer, ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])
    eot = llama3.convert_tokens_to_ids("<|eot_id|>")
    assert eot in eos_ids_of(model, llama3)  # no template of its own: the built-in chosen uses it
    llama3.chat_template = BUILTIN["chatml"]  # its own template never ends a turn with it
    assert eot not in eos_ids_of(model, llama3)
    model.generation_config.eos_token_id = None
    gemma_stops = eos_ids_of(model, gemma_tokenizer)
    assert gemma_tokenizer.convert_tokens_to_ids("<end_of_turn>") in gemma_stops


@pytest.mark.gemma
def test_a_reply_that_ends_its_turn_stops_there(gemma_tokenizer):
    """Through the engine, with Gemma's tokenizer on a tiny model whose only nonzero output row is
    <end_of_turn>'s (so it is the greedy pick): the reply is that one token, and it ends the reply."""
    from pathlib import Path

    from radixchat.engine.core import EngineConfig, EngineCore
    from radixchat.engine.loader import describe_model
    from radixchat.engine.request import SamplingParams

    config = tiny_config("llama")
    config.vocab_size, config.tie_word_embeddings = len(gemma_tokenizer), False
    model, ref = build_pair(config)
    ids = Conversation(ChatFormat(gemma_tokenizer, model_type="gemma3_text")).add_user("Hi")
    end = gemma_tokenizer.convert_tokens_to_ids("<end_of_turn>")
    with torch.no_grad():
        last = ref.model(torch.tensor([ids])).last_hidden_state[0, -1]  # same weights as ``model``
        head = model.get_output_embeddings().weight
        head.zero_()
        head[end] = last
    loaded = describe_model(model, gemma_tokenizer, "tiny", Path("."))
    assert end in loaded.eos_ids
    core = EngineCore(loaded, EngineConfig(kv_pool_tokens=256))
    req = core.make_request(ids, SamplingParams(max_tokens=16))
    core.run_until_done([req])
    assert req.output_ids == [end]
