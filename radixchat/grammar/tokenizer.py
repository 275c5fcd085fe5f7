"""What the grammar package needs to know about a tokenizer: each token's bytes, and which are special.

``TokenizerInfo`` is the vocabulary alone, built once per tokenizer and shared by every grammar compiled
for it: token bytes, special and EOS ids, and the views of the bytes that runs read (flat bytes, tokens
by first byte, the sorted vocabulary). What is computed over it per lexer state (the runs of the
vocabulary and the masks) is cached beside the runs, in ``run_cache.RunCache.of(info)``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence

import numpy as np

from .errors import GrammarError

#: Version of the names in ``save_cache``'s index (2: counted DFAs' states are ``[skeleton, count]``).
CACHE_FORMAT = 2
FILTER_ROWS = 256  # rows_groups runs a bigger group's rows only where their next byte lives


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's printable stand-ins for bytes, inverted: char -> byte."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_DECODER = _bytes_to_unicode()


def _decode_byte_level(piece: str) -> bytes | None:
    try:
        return bytes(_BYTE_DECODER[c] for c in piece)
    except KeyError:
        return None


def _decode_sentencepiece(piece: str) -> bytes:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece.replace("\u2581", " ").encode("utf-8")


class TokenizerInfo:
    """Token bytes, special tokens and EOS ids of one tokenizer, for a logits width ``vocab_size``.

    Invariants: ``token_bytes[i]`` is None for special tokens, empty tokens and ids the tokenizer does
    not define; such tokens never match grammar text. ``vocab_size >= len(token_bytes)``; ids past the
    tokenizer (padding rows of the logits) are never allowed.
    """

    def __init__(
        self,
        token_bytes: Sequence[bytes | None],
        *,
        vocab_size: int | None = None,
        eos_ids: Iterable[int] = (),
        special: dict[int, str] | None = None,
    ) -> None:
        n = len(token_bytes)
        self.vocab_size = int(vocab_size if vocab_size is not None else n)
        if self.vocab_size < n:
            raise GrammarError(f"vocab_size {self.vocab_size} is smaller than the tokenizer ({n} tokens)")
        self.special_text: dict[int, str] = dict(special or {})
        self.eos_ids: tuple[int, ...] = tuple(sorted(set(int(i) for i in eos_ids)))
        if not self.eos_ids:
            raise GrammarError("TokenizerInfo needs at least one EOS token id")
        for i in self.eos_ids:
            if not 0 <= i < self.vocab_size:
                raise GrammarError(f"EOS id {i} is outside the vocabulary (size {self.vocab_size})")
        self.token_bytes: list[bytes | None] = [
            None if (b is None or len(b) == 0 or i in self.special_text or i in self.eos_ids) else bytes(b)
            for i, b in enumerate(token_bytes)
        ]
        lens = np.array([len(b) if b is not None else 0 for b in self.token_bytes], dtype=np.int32)
        starts = np.zeros(n, dtype=np.int64)
        if n:
            starts[1:] = np.cumsum(lens[:-1])
        self.lens = lens
        self.starts = starts
        self.flat = np.frombuffer(
            b"".join(b for b in self.token_bytes if b is not None) + b"\0", dtype=np.uint8
        )
        self.text_ids = np.flatnonzero(lens > 0).astype(np.int64)
        # Text tokens grouped by first byte: a lexer state's run starts only from the bytes it takes.
        # ``first_byte[i]`` is text token ``text_ids[i]``'s first byte; ``by_first_byte`` the text tokens
        # ordered by it, byte b's from ``first_byte_bounds[b]`` to ``first_byte_bounds[b + 1]``.
        self.first_byte = self.flat[self.starts[self.text_ids]]
        order = np.argsort(self.first_byte, kind="stable")
        self.by_first_byte = self.text_ids[order]
        self.first_byte_bounds = np.searchsorted(self.first_byte[order], np.arange(257))
        # The vocabulary sorted by bytes: a prefix's tokens are one range (``vocab_runs.walk_run``).
        order = sorted(self.text_ids.tolist(), key=self.token_bytes.__getitem__)
        self.sorted_bytes = [self.token_bytes[i] for i in order]
        self.sorted_ids = np.array(order, dtype=np.int64)
        self.max_token_bytes = int(lens.max()) if n else 0
        self._token_set: frozenset[bytes] | None = None  # the text tokens' bytes (``greedy_tokens``)
        self.fingerprint = hashlib.sha256(self.flat.tobytes() + lens.tobytes()).hexdigest()[:16]

    # -- construction ------------------------------------------------------------------------------

    @classmethod
    def from_tokenizer(
        cls, tokenizer, vocab_size: int | None = None, eos_ids: Iterable[int] | None = None
    ) -> TokenizerInfo:
        """Build from a Hugging Face tokenizer (fast/``tokenizers``-backed; byte-level BPE or SentencePiece).

        ``vocab_size`` is the model's logits width (default: the tokenizer's length). ``eos_ids`` are the
        ids that end generation (default: the tokenizer's ``eos_token_id``); pass the model's
        ``generation_config.eos_token_id`` when it lists several.
        """
        backend = getattr(tokenizer, "backend_tokenizer", None)
        spec = json.loads(backend.to_str()) if backend is not None else {}
        decoder = json.dumps(spec.get("decoder") or {})
        byte_level = '"ByteLevel"' in decoder
        added: dict[int, tuple[str, bool]] = {}
        for tok in spec.get("added_tokens", []):
            added[int(tok["id"])] = (tok["content"], bool(tok.get("special")))
        for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
            added.setdefault(int(i), (str(tok.content), bool(getattr(tok, "special", False))))
        vocab = tokenizer.get_vocab()
        n = max([len(tokenizer)] + [i + 1 for i in vocab.values()] + [i + 1 for i in added])
        pieces: list[str | None] = [None] * n
        for piece, i in vocab.items():
            pieces[i] = piece
        token_bytes: list[bytes | None] = [None] * n
        special: dict[int, str] = {}
        for i, piece in enumerate(pieces):
            if i in added:
                content, is_special = added[i]
                if is_special:
                    special[i] = content
                else:
                    token_bytes[i] = content.encode("utf-8")
            elif piece is not None:
                token_bytes[i] = _decode_byte_level(piece) if byte_level else _decode_sentencepiece(piece)
        if eos_ids is None:
            eos = tokenizer.eos_token_id
            eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        return cls(token_bytes, vocab_size=vocab_size, eos_ids=eos_ids, special=special)

    def greedy_tokens(self, data: bytes) -> list[bytes]:
        """``data`` cut into the longest text tokens from its start, one after another: how a model most
        likely writes a text it was shown. Stops where no token starts (never, in a byte-level
        vocabulary)."""
        if self._token_set is None:
            self._token_set = frozenset(self.sorted_bytes)
        out, at, longest = [], 0, self.max_token_bytes
        while at < len(data):
            end = next(
                (e for e in range(min(len(data), at + longest), at, -1) if data[at:e] in self._token_set), at
            )
            if end == at:
                break
            out.append(data[at:end])
            at = end
        return out
