"""Bounds on compiling: whatever a grammar or schema asks for, compiling ends, in bounded memory.

Memory is bounded by counted limits where structures grow (DFA and NFA states, LALR states, lexer
states, unrolled repetitions, generated rules, parses followed at once). Time is bounded by a deadline
that the long loops check (``check``): past it they raise ``GrammarError``, so a request with a
pathological schema fails alone, with one line saying so, and everything else goes on.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from .errors import GrammarError

#: Seconds a schema or grammar may take to compile before it is refused.
COMPILE_SECONDS = 20.0

_DEADLINE: ContextVar[tuple[float, float, str] | None] = ContextVar("grammar_deadline", default=None)


@contextmanager
def deadline(seconds: float | None, what: str) -> Iterator[None]:
    """Compile ``what`` within ``seconds`` (None: no limit); nested deadlines keep the earliest."""
    outer = _DEADLINE.get()
    token = None
    if seconds is not None:
        end = time.monotonic() + seconds
        if outer is None or end < outer[0]:
            token = _DEADLINE.set((end, seconds, what))
    try:
        yield
    finally:
        if token is not None:
            _DEADLINE.reset(token)


def past_deadline() -> bool:
    """Whether the current compile is past its deadline (for work a compile may leave undone)."""
    d = _DEADLINE.get()
    return d is not None and time.monotonic() > d[0]


def check(where: str = "") -> None:
    """Raise GrammarError if the current compile is past its deadline."""
    if past_deadline():
        d = _DEADLINE.get()
        near = f" (near {where})" if where else ""
        raise GrammarError(f"{d[2]}: too complex to compile within {d[1]:g} s{near}")


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while compiling (nested: the outermost resumes it).

    Compiling allocates hundreds of thousands of small containers (LR items, DFA rows, rule lists),
    which triggers full collections; each walks every object of the process (a loaded model and
    tokenizer make that slow), several times per big schema. Compiling makes little cyclic garbage;
    what it makes is collected after."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
