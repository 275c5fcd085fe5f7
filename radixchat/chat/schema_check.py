"""The final check of a JSON-mode reply against its schema, with JSON Schema's own validator.

The grammar guarantees a strict schema as the reply is generated; in lenient mode it enforces what it
can and leaves keywords such as ``uniqueItems``, ``not`` or ``if``/``then``/``else`` to this check, whose
findings front ends show (batch: ``"schema_errors"``). Torch-free: the chat app may import it.
"""

from __future__ import annotations

import json
from typing import Any

MAX_ERRORS = 20


def schema_errors(schema: Any, text: str) -> list[str]:
    """Why ``text`` fails ``schema``, one line each (``[]``: valid). ``None`` means any JSON object."""
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError as exc:
        return [f"the reply is not JSON: {exc}"]
    if schema is None:
        schema = {"type": "object"}
    if isinstance(schema, str):
        schema = json.loads(schema)
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
    out = []
    for err in errors[:MAX_ERRORS]:
        where = "#" + "".join(f"/{p}" for p in err.absolute_path)
        out.append(f"{where}: {err.message} ({err.validator})")
    return out
