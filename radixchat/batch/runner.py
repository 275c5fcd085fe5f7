"""Running the conversations of a batch: each line's plan (from the line, its saved session and the
settings), its turns in order through the backend, and its session saved at the end (or when stopped).
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from pathlib import Path

from radixchat.batch.input import BatchLine, Job, id_note
from radixchat.batch.output import Progress, Writer, record
from radixchat.chat.attachments import compose_message
from radixchat.chat.backend import ChatBackend, Reply, TurnResult, grammar_for, sampling_params
from radixchat.chat.conversation import Conversation
from radixchat.chat.modes import ConstraintSpec
from radixchat.chat.schema_check import schema_errors
from radixchat.chat.session import SamplingSettings, SessionFile, conversation_from_session, load_session
from radixchat.chat.session_state import SessionState, ToolChoice
from radixchat.chat.tool_turn import ToolTurn, run_tool_turn
from radixchat.chat.tools import Tool, ToolRegistry, allow_listed
from radixchat.config import Settings
from radixchat.errors import RadixchatError
from radixchat.sampling import SamplingParams


@dataclass(kw_only=True)
class Plan(SessionState):
    """How one conversation runs: its session's fields (what ``--save-sessions`` writes), resolved from
    its line, its saved session and the settings, plus what running it needs."""

    conv: Conversation
    params: SamplingParams
    tools: list[Tool] = field(default_factory=list)  # the offered tools (tool mode)
    # The tool_choice the turns run with: the line's, else "auto". (The saved file keeps the continued
    # session's own, as ``tool_choice``.)
    run_tool_choice: ToolChoice = "auto"
    # The line's "schema_mode" is "lenient": keywords the grammar cannot enforce are checked on each
    # finished reply instead ("schema_errors").
    lenient: bool = False


class BatchRunner:
    """Runs jobs (each one conversation, its turns in order) and writes their records as turns finish."""

    def __init__(
        self,
        backend: ChatBackend,
        settings: Settings,
        writer: Writer,
        progress: Progress,
        save_dir: Path | None,
        registry: ToolRegistry,
        allow_tools: frozenset[str] = frozenset(),
    ) -> None:
        self.backend = backend
        self.settings = settings
        self.writer = writer
        self.progress = progress
        self.save_dir = save_dir
        self.registry = registry  # the config file's tools and its MCP servers'

        self.consent = allow_listed(set(allow_tools))
        self.turns = 0

    async def run_job(self, job: Job) -> None:
        try:
            await self._run(job)
        finally:
            self.writer.finish(job)

    async def _run(self, job: Job) -> None:
        spec = job.spec
        if spec is None:
            job.failed = True
            self.writer.add(job, record(job, None, error=job.error))
            return
        try:
            plan = await plan_line(self.backend, self.settings, self.registry, spec)
        except RadixchatError as exc:
            job.failed = True
            self.writer.add(job, record(job, None, error=f"line {job.line}{id_note(job)}: {exc}"))
            return
        kept, written = len(plan.conv.messages), 0  # messages and records of the completed turns
        try:
            for turn, text in enumerate(spec.turns):
                if turn == 0:
                    text = compose_message(text, job.attachments)
                try:
                    result, tool_turn = await self._turn(plan, text)
                except RadixchatError as exc:
                    job.failed = True
                    self.writer.add(
                        job, record(job, turn, error=f"line {job.line}{id_note(job)} turn {turn}: {exc}")
                    )
                    break
                self.turns += 1
                self.progress.turn_done()
                if result.finish_reason == "error":
                    job.failed = True
                errors = None
                if plan.mode == "json" and result.finish_reason != "error":
                    errors = schema_errors(plan.schema, result.message.content)
                self.writer.add(job, record(job, turn, result, tool_turn=tool_turn, schema_errors=errors))
                written += 1
                if result.finish_reason == "error":
                    break  # the failed turn is in the record, not in the session to continue
                kept = len(plan.conv.messages)
                if result.finish_reason == "cancelled":
                    break
        except asyncio.CancelledError:
            # Interrupted: the turns already written are saved too, without the one in flight.
            if self.save_dir is not None and written:
                plan.conv = plan.conv.truncated(kept)
                self._write(job, plan, plan.session_file(plan.conv, str(spec.id)))
            raise
        if self.save_dir is not None:
            plan.conv = plan.conv.truncated(kept)  # without a failed turn (its user message included)
            # In a thread: the KV save waits for the engine's thread (between steps) and for the disk.
            session = plan.session_file(plan.conv, str(spec.id))
            await asyncio.to_thread(self._write, job, plan, session, True)

    async def _turn(self, plan: Plan, text: str) -> tuple[TurnResult, ToolTurn | None]:
        if plan.mode == "tool":
            tool_turn = await run_tool_turn(
                self.backend,
                plan.conv,
                text,
                plan.params,
                plan.tools,
                self.registry,
                plan.tool_ctx,
                self.consent,
                tool_choice=plan.run_tool_choice,
                max_rounds=self.settings.max_tool_rounds,
                max_calls=self.settings.max_tool_calls,
            )
            return tool_turn.final, tool_turn
        reply = await start_reply(self.backend, plan, text)
        return await reply.result(), None

    def _write(self, job: Job, plan: Plan, session: SessionFile, kv: bool = False) -> None:
        """Write the line's session; with ``kv``, then its KV (best effort: a failure is one line on
        stderr, and the run's exit code does not change). Interrupted runs save the file only."""
        name = session.name
        try:
            saved = plan.write(session, self.save_dir, self.backend if kv else None, plan.conv.ids)
        except OSError as exc:
            job.failed = True
            print(f"radixchat: cannot save session {name!r}: {exc}", file=sys.stderr)
            return
        if saved.kv_notice:
            print(f"radixchat: session {name!r} saved; {saved.kv_notice}", file=sys.stderr)


async def plan_line(
    backend: ChatBackend, settings: Settings, registry: ToolRegistry, spec: BatchLine
) -> Plan:
    """How the conversation of ``spec`` runs (a batch line, or the one-turn line of ``radixchat -p``),
    resolved from the line, its saved session and the settings. Raises RadixchatError (an unreadable or
    other-model session, unknown tools, a schema the constraint refuses: ``ModeError``)."""
    saved = None
    if spec.session is not None:
        saved = load_session(Path(spec.session), expect_model=backend.model_name)
        conv = conversation_from_session(saved, backend.fmt, backend.model_name)
    else:
        system = spec.system if spec.system is not None else settings.system_prompt
        conv = backend.new_conversation(system=system)
    if spec.context_overflow is not None:
        conv.context_overflow = spec.context_overflow
    mode = saved.mode if saved is not None and "mode" not in spec.model_fields_set else spec.mode
    # A continued session keeps its sampling settings; the line's own values win over them.
    kept = saved.sampling.model_dump() if saved is not None else {}
    given = {n: getattr(spec, n) for n in SamplingSettings.model_fields if getattr(spec, n) is not None}
    sampling = SamplingSettings(**{**kept, **given})
    plan = Plan(
        conv=conv,
        params=sampling_params(settings, **sampling.model_dump()),
        model=backend.model_name,
        mode=mode,
        sampling=sampling,
        base=saved,
        tool_names=[],
    )
    if saved is not None:
        plan.tool_ctx.notes = saved.notes
        plan.tool_choice = saved.tool_choice
    if mode == "json":
        plan.schema = spec.json_schema if spec.json_schema is not None or saved is None else saved.json_schema
        plan.lenient = spec.schema_mode == "lenient"
    if mode == "tool":
        names = spec.tools if spec.tools is not None else (saved.tools or None if saved is not None else None)
        plan.tools = registry.select(names)
        plan.tool_names = [t.name for t in plan.tools]
        plan.run_tool_choice = spec.tool_choice if spec.tool_choice is not None else "auto"
    # Compiling checks the schema / tools before any turn runs; each turn gets a fresh matcher.
    decls = [t.schema() for t in plan.tools] or None
    constraint = ConstraintSpec(mode, plan.schema, decls, plan.run_tool_choice, plan.lenient)
    await asyncio.to_thread(grammar_for, backend, constraint)
    return plan


async def start_reply(backend: ChatBackend, plan: Plan, text: str) -> Reply:
    """Start the reply to ``text`` in a chat or json plan: the user message added, a fresh constraint,
    the reply begun (iterate it for text, or await ``result()``). Raises RadixchatError
    (ContextOverflowError, a refused request)."""
    plan.conv.add_user(text)
    spec = ConstraintSpec(plan.mode, plan.schema, lenient=plan.lenient)
    grammar = await asyncio.to_thread(grammar_for, backend, spec)
    return backend.reply(plan.conv, plan.params, grammar)
