"""Per-request matcher: the object the engine's sampler asks for a token mask each step.

It satisfies the engine's ``TokenMatcher`` protocol (``allowed``, ``advance``, ``is_accepting``,
``is_terminated``) without importing the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from .errors import GrammarError
from .lexer_space import DEAD

if TYPE_CHECKING:
    import numpy as np

    from .tokenizer import TokenizerInfo

Configs = tuple[tuple[tuple[int, ...], int], ...]  # the parses followed: (LALR stack, lexer state) each


class MaskEntry(Protocol):
    """The mask of one parser state, as the grammar gives it (``compiler.Entry``)."""

    @property
    def tensor(self) -> torch.Tensor: ...
    @property
    def mask(self) -> np.ndarray: ...
    @property
    def accepting(self) -> bool: ...
    @property
    def only_eos(self) -> bool: ...


class StartContext(Protocol):
    @property
    def lex0(self) -> int: ...


class MatcherGrammar(Protocol):
    """What a matcher uses of its grammar. ``compiler.CompiledGrammar`` is it, and creates the matchers:
    so the matcher names these members here instead of importing the compiler, even for type checking
    (a module importing a module that imports it back is a loop)."""

    info: TokenizerInfo
    initial_stack: tuple[int, ...]
    horizon: int

    def context(self, stack: tuple[int, ...], after_ignore: bool) -> tuple[StartContext, int]: ...
    def entry(self, stack: tuple[int, ...], lex: int) -> MaskEntry: ...
    def union(self, configs: Configs) -> MaskEntry: ...
    def feed(self, stack: tuple[int, ...], lex: int, data: bytes) -> list[tuple[tuple[int, ...], int]]: ...
    def token_bytes(self, tid: int) -> bytes | None: ...
    def lex_cost(self, stack: tuple[int, ...], lex: int) -> int: ...
    def max_next_cost(self, stack: tuple[int, ...], lex: int) -> int: ...
    def budget_mask(self, configs: Configs, remaining: int) -> torch.Tensor: ...


class GrammarMatcher:
    """The state of one constrained output: its parser states ``(LALR stack, lexer state)`` -- one for an
    LALR(1) grammar, several while a general (GLR) parse is forked -- plus the tokens taken so far.

    Contract: ``allowed()`` never returns an all-False mask; EOS ids are set iff ``is_accepting()``;
    after ``advance(eos)`` the matcher is finished and only EOS stays allowed.
    """

    __slots__ = ("grammar", "configs", "_entry", "finished", "n_tokens", "_eos", "budget_limited")

    def __init__(self, grammar: MatcherGrammar) -> None:
        self.grammar = grammar
        stack = grammar.initial_stack
        ctx, _ = grammar.context(stack, False)
        self.configs: Configs = ((stack, ctx.lex0),)
        self._entry: MaskEntry | None = None
        self.finished = False
        self.n_tokens = 0
        # True when the last ``allowed(remaining)`` removed tokens only because the budget ran low: an
        # EOS taken then ends an output the model was not done with (the engine reports ``length``).
        self.budget_limited = False
        self._eos = frozenset(grammar.info.eos_ids)

    @property
    def stack(self) -> tuple[int, ...]:
        """The LALR stack of the first parse (the only one for LALR(1) grammars)."""
        return self.configs[0][0]

    @property
    def lex(self) -> int:
        return self.configs[0][1]

    def _current(self) -> MaskEntry:
        e = self._entry
        if e is None:
            c = self.configs
            e = self._entry = self.grammar.entry(*c[0]) if len(c) == 1 else self.grammar.union(c)
        return e

    # -- the TokenMatcher protocol ---------------------------------------------------------------------

    def allowed(self, remaining: int | None = None) -> torch.Tensor:
        """bool[vocab_size] on CPU (interned: do not mutate). With ``remaining`` (tokens the request may
        still generate, EOS included), only tokens after which the output can still be completed in
        budget are allowed (see ``CompiledGrammar.budget_mask``)."""
        e = self._current()
        self.budget_limited = False
        if remaining is None or self.finished:
            return e.tensor
        g = self.grammar
        limit = remaining - 2
        if limit >= min(g.lex_cost(st, lx) for st, lx in self.configs) + g.horizon or limit >= max(
            g.max_next_cost(st, lx) for st, lx in self.configs
        ):
            return e.tensor
        mask = g.budget_mask(self.configs, max(int(remaining), 1))
        # masks are interned: equal masks share one array (their tensors are distinct objects)
        self.budget_limited = mask.data_ptr() != e.tensor.data_ptr()
        return mask

    def can_advance(self, token_id: int) -> bool:
        e = self._current()
        return 0 <= token_id < e.mask.shape[0] and bool(e.mask[token_id])

    def advance(self, token_id: int) -> None:
        """Take one token. Raises GrammarError (state unchanged) if it is not allowed here."""
        token_id = int(token_id)
        if self.finished:
            if token_id in self._eos:
                return
            raise GrammarError(f"token {token_id} after EOS")
        if not self.can_advance(token_id):
            raise GrammarError(f"token {token_id} is not allowed here")
        if token_id in self._eos:
            self.finished = True
            self.n_tokens += 1
            return
        data = self.grammar.token_bytes(token_id)
        configs = self._feed(data) if data is not None else ()
        if not configs:  # pragma: no cover - the mask said yes; a disagreement is a bug
            raise GrammarError(f"token {token_id} was allowed but cannot be fed (internal error)")
        self.configs = configs
        self._entry = None
        self.n_tokens += 1

    def _feed(self, data: bytes) -> tuple:
        feed = self.grammar.feed
        if len(self.configs) == 1:
            return tuple(feed(*self.configs[0], data))
        return tuple(dict.fromkeys(c for st, lx in self.configs for c in feed(st, lx, data)))

    def is_accepting(self) -> bool:
        """True when EOS is allowed here (the output so far is complete)."""
        return self.finished or self._current().accepting

    def is_terminated(self) -> bool:
        """Accepting and nothing but EOS can follow (or EOS was taken): the engine may stop."""
        return self.finished or self._current().only_eos

    # -- extras ------------------------------------------------------------------------------------------

    def advance_bytes(self, data: bytes) -> None:
        """Feed raw text bytes (e.g. a forced prefix). Raises GrammarError if they cannot continue."""
        configs = tuple(c for c in self._feed(data) if c[1] != DEAD)
        if not configs:
            raise GrammarError(f"bytes {data[:40]!r} cannot continue the output here")
        self.configs = configs
        self._entry = None

    def copy(self) -> GrammarMatcher:
        """An independent matcher in the same state (states are immutable tuples: O(1))."""
        m = GrammarMatcher.__new__(GrammarMatcher)
        m.grammar, m.configs, m._entry = self.grammar, self.configs, self._entry
        m.finished, m.n_tokens, m._eos = self.finished, self.n_tokens, self._eos
        m.budget_limited = self.budget_limited
        return m

    def shortest_completion(self) -> int:
        """Bytes of the shortest text that completes the output from here (0 when accepting)."""
        if self.finished:
            return 0
        return int(min(self.grammar.lex_cost(st, lx) for st, lx in self.configs))
