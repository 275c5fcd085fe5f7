"""Tool use with the default model: do its calls run, and are their results right?

A fixed set of prompts (arithmetic of several sizes, the time in named zones, session notes, and
questions that need no tool) goes through the real chat layer (``LocalBackend`` + ``run_tool_turn``, the
path the app and ``--batch`` take), greedy (temperature 0, no repetition penalty). Only the first round is
generated: the turn stops after the calls have run, so the figures say what the model's calls did.

- ``required``: every tool prompt with ``tool_choice="required"``. Reported: the share of calls that
  executed without error, the share of turns whose calls gave the right result, and turns that ended
  with no call at all (e.g. ``finish_reason: length`` inside a block).
- ``auto``: every prompt, tool prompts and no-tool prompts, with ``tool_choice="auto"``. Reported: the
  share of turns that call a tool when one is needed, and that answer without one when none is.

    OMP_NUM_THREADS=2 .venv/bin/python -m bench.tool_use [--max-tokens 160] [--json out.json]

It uses only what main's chat layer already had (``run_tool_turn``'s ``should_continue``), so the same
file runs against an older checkout for a before/after comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import dataclass

os.environ.setdefault("RADIXCHAT_WEIGHTS", "float32")  # the exact path; no background compiler
os.environ.setdefault("RADIXCHAT_COMPILE", "off")

from radixchat.chat.local import LocalBackend  # noqa: E402
from radixchat.chat.tool_turn import run_tool_turn  # noqa: E402
from radixchat.chat.tools import ToolContext, ToolRegistry, deny_all  # noqa: E402
from radixchat.config import Settings  # noqa: E402
from radixchat.sampling import SamplingParams  # noqa: E402


@dataclass(frozen=True)
class Case:
    prompt: str
    tool: str | None  # the tool that answers it (None: no tool is needed)
    expect: str | None = None  # the right result: a number, a time zone, or text the notes must hold


CASES: list[Case] = [
    # arithmetic, small to large
    Case("What is 7 + 5?", "calculator", "12"),
    Case("What is 12 * 30?", "calculator", "360"),
    Case("Compute 144 / 12.", "calculator", "12"),
    Case("What is 99 - 57?", "calculator", "42"),
    Case("What is 1234 * 5678?", "calculator", "7006652"),
    Case("What is 2 to the power of 20?", "calculator", "1048576"),
    Case("What is (15 + 27) * 3?", "calculator", "126"),
    Case("Calculate 98765 + 43210.", "calculator", "141975"),
    Case("What is 17 % 5?", "calculator", "2"),
    Case("What is 3.5 * 4.2?", "calculator", "14.7"),
    Case("What is (100 - 36) / 8?", "calculator", "8"),
    Case("How much is 250 * 4 + 75?", "calculator", "1075"),
    Case("What is 123456789 * 987654321?", "calculator", "121932631112635269"),
    Case("What is ((2 + 3) * (7 - 4)) ** 2?", "calculator", "225"),
    Case("If I have 3 boxes of 24 eggs and break 5, how many eggs are left?", "calculator", "67"),
    Case("What is 1000000 / 250?", "calculator", "4000"),
    # the time in a named zone
    Case("What time is it in Tokyo?", "now", "Asia/Tokyo"),
    Case("What is the current time in Paris?", "now", "Europe/Paris"),
    Case("What time is it now in New York?", "now", "America/New_York"),
    Case("Tell me the current date and time in London.", "now", "Europe/London"),
    Case("What time is it in Sydney right now?", "now", "Australia/Sydney"),
    Case("What's the time in Berlin?", "now", "Europe/Berlin"),
    Case("What time is it in Los Angeles?", "now", "America/Los_Angeles"),
    Case("What is the date today in UTC?", "now", "UTC"),
    # session notes
    Case("Save a note that says: buy milk.", "write_session_notes", "milk"),
    Case("Write 'meeting at 3pm' into my session notes.", "write_session_notes", "meeting"),
    Case("Append 'call Alice' to my notes.", "write_session_notes", "Alice"),
    Case("Remember this in the notes: the wifi password is hunter2.", "write_session_notes", "hunter2"),
    Case("What is in my session notes?", "read_session_notes", None),
    Case("Read my notes back to me.", "read_session_notes", None),
    # no tool needed
    Case("Hello! How are you?", None),
    Case("Write a haiku about the sea.", None),
    Case("What is the capital of France?", None),
    Case("Tell me a fun fact about octopuses.", None),
    Case("Say thank you in Spanish.", None),
    Case("What colour is the sky on a clear day?", None),
]
SYSTEM = "You are a helpful assistant. Use a tool when it helps."
NOTES = "dentist on Friday"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def right_result(case: Case, records: list) -> bool:
    """Whether a call of the turn gave the expected result."""
    for r in records:
        if r.error is not None or r.name != case.tool:
            continue
        if case.tool == "calculator":
            got, want = _number(r.result or ""), float(case.expect or "nan")
            if got is not None and abs(got - want) <= 1e-9 * max(1.0, abs(want)):
                return True
        elif case.tool == "now":
            zone = (r.arguments or {}).get("timezone") or "UTC"
            if zone == case.expect or (case.expect == "UTC" and zone.upper() in ("UTC", "ETC/UTC")):
                return True
        elif case.tool == "write_session_notes":
            if case.expect and case.expect.lower() in str((r.arguments or {}).get("text", "")).lower():
                return True
        else:
            return True
    return False


async def run_case(backend, registry, case: Case, choice: str, max_tokens: int) -> dict:
    conv = backend.new_conversation(SYSTEM)
    tools = registry.select(None)
    ctx = ToolContext(notes=NOTES)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, repetition_penalty=1.0, seed=0)
    t0 = time.perf_counter()
    turn = await run_tool_turn(
        backend, conv, case.prompt, params, tools, registry, ctx, deny_all,
        tool_choice=choice, max_rounds=1, should_continue=lambda: False,
    )  # fmt: skip
    first = turn.rounds[0]
    return {
        "prompt": case.prompt,
        "choice": choice,
        "tool": case.tool,
        "finish_reason": first.finish_reason,
        "reply": first.message.content,
        "attempted": "<tool_call>" in first.message.content,
        "calls": [c.as_dict() for c in turn.calls],
        "ok_calls": sum(c.error is None for c in turn.calls),
        "right": right_result(case, turn.calls) if case.tool else None,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def summarize(rows: list[dict]) -> dict:
    req = [r for r in rows if r["choice"] == "required"]
    calls = sum(len(r["calls"]) for r in req)
    ok = sum(r["ok_calls"] for r in req)
    auto = [r for r in rows if r["choice"] == "auto"]
    need = [r for r in auto if r["tool"]]
    skip = [r for r in auto if not r["tool"]]
    return {
        "required_turns": len(req),
        "required_calls": calls,
        "required_calls_ok": ok,
        "required_ok_share": round(ok / calls, 3) if calls else 0.0,
        "required_right": sum(bool(r["right"]) for r in req),
        "required_right_share": round(sum(bool(r["right"]) for r in req) / len(req), 3),
        "required_no_call": sum(not r["calls"] for r in req),
        "required_length": sum(r["finish_reason"] == "length" for r in req),
        "auto_called_when_needed": f"{sum(bool(r['calls']) for r in need)}/{len(need)}",
        "auto_skipped_when_not": f"{sum(not r['attempted'] for r in skip)}/{len(skip)}",
        "auto_right": f"{sum(bool(r['right']) for r in need)}/{len(need)}",
        "auto_text_then_call": sum(
            bool(r["calls"]) and not r["reply"].lstrip().startswith("<tool_call>") for r in auto
        ),
    }


async def main_async(args) -> None:
    settings = Settings(temperature=0.0)
    backend = await asyncio.to_thread(LocalBackend.from_settings, settings)
    await backend.start()
    registry = ToolRegistry()
    rows = []
    try:
        for choice in ("required", "auto"):
            for case in CASES:
                if choice == "required" and case.tool is None:
                    continue
                row = await run_case(backend, registry, case, choice, args.max_tokens)
                rows.append(row)
                print(json.dumps(row, ensure_ascii=False), flush=True)
    finally:
        await backend.aclose()
    summary = summarize(rows)
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1, ensure_ascii=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--json", help="write the rows and the summary here")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
