"""Chat templates for models that ship none (base models, many GGUFs), chosen the way llama.cpp does.

A model's own template (the tokenizer's ``chat_template``) always wins unless ``chat_template`` names
another. Without one, the format is chosen by the tokenizer's special tokens first (a tokenizer that has
``<start_of_turn>`` was trained on Gemma's turns, whatever the architecture says), then by the architecture,
and ChatML last; the choice is said in a one-line notice, since a wrong format gives fluent garbage rather
than an error. ``--chat-template NAME|FILE`` picks a built-in by name or a Jinja file.

The built-ins follow the published templates of each family, without their tool sections: tools then go
into the system message in the generic format (``conversation.generic_tools_text``). Roles a family has no
turn for (Gemma's and Mistral's ``tool``, Gemma's ``system``) are folded the way its own template does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixchat.errors import RadixchatError

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen2/2.5: ChatML with a default system prompt when the conversation has none.
QWEN = (
    "{% if not messages or messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}" + CHATML
)

LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'ipython' if message['role'] == 'tool' else message['role'] %}"
    "{{ '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# Gemma has only user and model turns: the system prompt opens the first user turn.
GEMMA = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = message['content'] | trim + '\n\n' %}"
    "{% else %}{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\n' + ns.system + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% set ns.system = '' %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# Mistral's instruct format: the system prompt opens the first user turn; replies end with EOS.
MISTRAL = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\n\n' %}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ '[INST] ' + ns.system + message['content'] + ' [/INST]' }}{% set ns.system = '' %}{% endif %}"
    "{% endfor %}"
)

PHI3 = (
    "{% for message in messages %}"
    "{% set role = 'user' if message['role'] == 'tool' else message['role'] %}"
    "{{ '<|' + role + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

BUILTIN: dict[str, str] = {
    "chatml": CHATML,
    "gemma": GEMMA,
    "llama3": LLAMA3,
    "mistral": MISTRAL,
    "phi3": PHI3,
    "qwen": QWEN,
}

# (special tokens the tokenizer must all have, the built-in they mean), in order.
_BY_TOKENS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<start_of_turn>", "<end_of_turn>"), "gemma"),
    (("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), "llama3"),
    (("<|user|>", "<|assistant|>", "<|end|>"), "phi3"),
    (("<|im_start|>", "<|im_end|>"), "chatml"),
    (("[INST]", "[/INST]"), "mistral"),
)
_BY_ARCH: tuple[tuple[str, str], ...] = (
    ("gemma", "gemma"),
    ("qwen", "qwen"),
    ("phi3", "phi3"),
    ("mistral", "mistral"),
    ("mixtral", "mistral"),
)


class ChatTemplateChoiceError(RadixchatError):
    """``chat_template`` names neither a built-in nor a readable Jinja file."""


@dataclass(frozen=True, slots=True)
class TemplateChoice:
    text: str  # the Jinja template
    name: str  # "model" (its own), a built-in's name, or the file it was read from
    notice: str | None = None  # a one-line notice for the user (a choice made for them)


def describe_choice(name: str) -> str:
    return "the model's own template" if name == "model" else f"the '{name}' template"


def builtin_names() -> str:
    return ", ".join(sorted(BUILTIN))


def choose_template(tokenizer: Any, model_type: str | None = None, requested: str = "auto") -> TemplateChoice:
    """The template to render with: ``requested`` ("auto", a built-in name, or a Jinja file's path)."""
    if requested != "auto":
        if requested in BUILTIN:
            return TemplateChoice(BUILTIN[requested], requested)
        return TemplateChoice(read_template_file(requested), requested)
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, str) and own.strip():
        return TemplateChoice(own, "model")
    name, why = _guess(tokenizer, model_type)
    notice = (
        f"the model ships no chat template: using the built-in '{name}' template ({why}); "
        f"--chat-template NAME|FILE chooses another ({builtin_names()})"
    )
    return TemplateChoice(BUILTIN[name], name, notice)


def read_template_file(spec: str) -> str:
    path = Path(spec).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ChatTemplateChoiceError(
            f"chat template '{spec}' is neither a built-in ({builtin_names()}) nor an existing file"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatTemplateChoiceError(f"cannot read the chat template file {path}: {exc}") from None
    if not text.strip():
        raise ChatTemplateChoiceError(f"the chat template file {path} is empty")
    return text


def _guess(tokenizer: Any, model_type: str | None) -> tuple[str, str]:
    vocab = _vocab(tokenizer)
    for tokens, name in _BY_TOKENS:
        if all(t in vocab for t in tokens):
            if name == "chatml" and (model_type or "").startswith("qwen"):
                name = "qwen"
            return name, f"its tokenizer has {tokens[0]}"
    arch = (model_type or "").lower()
    for prefix, name in _BY_ARCH:
        if arch.startswith(prefix):
            return name, f"architecture {model_type}"
    return "chatml", "nothing in the model suggests another; its tokenizer reads the tags as plain text"


def _vocab(tokenizer: Any) -> dict[str, int]:
    get = getattr(tokenizer, "get_vocab", None)
    return get() if callable(get) else {}
