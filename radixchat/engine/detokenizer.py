"""Incremental detokenization with stop strings.

Text is produced with ``tokenizers``' ``DecodeStream``, which holds back bytes until they form complete
UTF-8 characters, so a replacement character is never emitted for a token that a later one completes.
On top of that we hold back any tail of the text that could still grow into a stop string.

Special tokens are decoded as text (``<|endoftext|>`` in the middle of a reply is what the model said),
except the end-of-sequence token that finishes a request, which the engine never feeds in. That keeps a
reply's text equal to the decoding of its ids, which is what lets the chat layer append the next turn
as a pure delta.
"""

from __future__ import annotations

from typing import Any

from tokenizers.decoders import DecodeStream


class Detokenizer:
    def __init__(self, tokenizer: Any | None, stop: tuple[str, ...] = ()) -> None:
        # ``tokenizer`` is a ``tokenizers.Tokenizer`` (a transformers tokenizer's ``backend_tokenizer``).
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=False) if tokenizer is not None else None
        self._stop = stop
        self.text = ""  # all text so far (cut at a stop string once one is found)
        self._emitted = 0

    def push(self, token_id: int) -> tuple[str, bool]:
        """Feed one token; return (text that is now safe to show, whether a stop string was hit)."""
        if self._stream is None:
            return "", False
        piece = self._stream.step(self._tokenizer, token_id)
        if piece:
            self.text += piece
        if not self._stop:
            return self._release(len(self.text)), False
        longest = max(len(s) for s in self._stop)
        search_from = max(0, self._emitted - longest + 1)
        hits = [i for i in (self.text.find(s, search_from) for s in self._stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            return self._release(len(self.text)), True
        return self._release(len(self.text) - self._pending_stop_prefix()), False

    def flush(self) -> str:
        """The text held back for a possible stop string, at the end of generation."""
        return self._release(len(self.text))

    def _pending_stop_prefix(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stop:
            for k in range(min(len(stop) - 1, len(self.text)), best, -1):
                if self.text.endswith(stop[:k]):
                    best = k
                    break
        return best

    def _release(self, upto: int) -> str:
        upto = max(upto, self._emitted)
        out = self.text[self._emitted : upto]
        self._emitted = upto
        return out
