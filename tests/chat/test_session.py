"""Session files: round trip, atomic writes, and clear errors that never touch the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixchat.chat.conversation import ChatFormat, Conversation
from radixchat.chat.session import (
    SESSION_VERSION,
    SessionFile,
    SessionMessage,
    conversation_from_session,
    load_session,
    safe_name,
    save_session,
    session_from_conversation,
    session_path,
)
from radixchat.errors import SessionError

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture
def conv(smol_tokenizer) -> Conversation:
    c = Conversation(ChatFormat(smol_tokenizer), system="Be kind.")
    c.add_user("Hi ünïcode 🎉")
    c.add_assistant(
        "Hello!", smol_tokenizer.encode("Hello!", add_special_tokens=False) + [2], "stop", usage={"x": 1}
    )
    return c


def test_round_trip_keeps_messages_and_token_ids(tmp_path, conv, smol_tokenizer):
    path = save_session(session_from_conversation(conv, name="greet", model=MODEL), tmp_path / "greet.json")
    loaded = load_session(path, expect_model=MODEL)
    assert loaded.turns == 1 and loaded.system_prompt == "Be kind."
    again = conversation_from_session(loaded, ChatFormat(smol_tokenizer), MODEL)
    assert again.ids == conv.ids and again.text == conv.text
    assert [m.content for m in again.messages] == [m.content for m in conv.messages]
    nxt = again.add_user("More?")
    assert nxt[: len(conv.ids)] == conv.ids and again.full_renders == 0


def test_other_model_drops_token_ids(tmp_path, conv, smol_tokenizer):
    path = save_session(session_from_conversation(conv, name="x", model="other-model"), tmp_path / "x.json")
    again = conversation_from_session(load_session(path), ChatFormat(smol_tokenizer), MODEL)
    assert again.ids == [] and len(again.messages) == 3
    assert again.add_user("next") == smol_tokenizer.encode(
        smol_tokenizer.apply_chat_template(
            [m.template_dict() for m in again.messages], add_generation_prompt=True, tokenize=False
        ),
        add_special_tokens=False,
    )


def test_token_ids_outside_the_vocabulary_are_dropped_and_the_text_rerendered(conv, smol_tokenizer):
    session = session_from_conversation(conv, name="x", model=MODEL)
    session.messages[1].token_ids = [999_999_999]
    again = conversation_from_session(session, ChatFormat(smol_tokenizer), MODEL)
    assert again.ids == [] and [m.content for m in again.messages] == [m.content for m in conv.messages]
    assert again.add_user("next")[: len(conv.ids)] == conv.ids  # the text renders to the real ids


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path, conv):
    path = tmp_path / "s.json"
    save_session(session_from_conversation(conv, name="s", model=MODEL), path)
    save_session(session_from_conversation(conv, name="s", model=MODEL), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]
    assert json.loads(path.read_text())["version"] == SESSION_VERSION


def test_failed_write_keeps_the_old_file(tmp_path, conv, monkeypatch):
    path = tmp_path / "s.json"
    save_session(session_from_conversation(conv, name="s", model=MODEL), path)
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(OSError):
        save_session(session_from_conversation(conv, name="changed", model=MODEL), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"version": 1, "name": "x", "model": "m", "messages": [', "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"name": "x"}', "no version"),
        ('{"version": 99, "name": "x", "model": "m"}', "version 99"),
        (
            '{"version": 2, "name": "x", "model": "m", "messages": [{"role": "robot", "content": ""}]}',
            "messages.0.role",
        ),
        (
            '{"version": 2, "name": "x", "model": "m", "messages": [{"role": "user", "content": "",'
            ' "token_ids": [5, -3]}]}',
            "messages.0.token_ids.1",
        ),
    ],
)
def test_bad_files_give_one_line_errors_and_stay_untouched(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(SessionError, match=message) as info:
        load_session(path)
    assert "\n" not in str(info.value)
    assert path.read_text() == content


def test_version_1_files_are_migrated_on_load_and_left_untouched(tmp_path):
    path = tmp_path / "old.json"
    old = {"version": 1, "name": "old", "model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    path.write_text(json.dumps(old))
    loaded = load_session(path)
    assert loaded.version == SESSION_VERSION and loaded.branches == [] and loaded.messages[0].content == "hi"
    assert json.loads(path.read_text()) == old


def test_branches_round_trip(tmp_path, conv):
    from radixchat.chat.session import SessionBranch, session_messages

    s = session_from_conversation(conv, name="b", model=MODEL)
    s.branches = [SessionBranch(label="first try", messages=session_messages(conv.truncated(2)))]
    again = load_session(save_session(s, tmp_path / "b.json"))
    assert again.branches[0].label == "first try" and len(again.branches[0].messages) == 2


def test_wrong_model_is_refused_when_asked(tmp_path, conv):
    path = save_session(session_from_conversation(conv, name="s", model="m1"), tmp_path / "s.json")
    with pytest.raises(SessionError, match="saved with model 'm1'"):
        load_session(path, expect_model="m2")


def test_missing_file(tmp_path):
    with pytest.raises(SessionError, match="not found"):
        load_session(tmp_path / "nope.json")


def test_names_are_made_safe(tmp_path):
    assert safe_name("../../etc/passwd") == "etc-passwd"
    assert session_path(tmp_path, "my chat/1").name == "my-chat-1.json"


def test_schema_field_round_trips_by_alias(tmp_path):
    s = SessionFile(name="j", model=MODEL, mode="json", schema={"type": "object"})
    path = save_session(s, tmp_path / "j.json")
    assert json.loads(path.read_text())["schema"] == {"type": "object"}
    assert load_session(path).json_schema == {"type": "object"}


# -- property tests -------------------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
messages = st.lists(
    st.builds(
        SessionMessage,
        role=st.sampled_from(["user", "assistant", "tool"]),
        content=st.text(max_size=200),
        token_ids=st.none() | st.lists(st.integers(0, 49151), max_size=50),
        finish_reason=st.none() | st.sampled_from(["stop", "length", "cancelled", "error"]),
        tool_calls=st.none()
        | st.lists(
            st.fixed_dictionaries({"name": st.text(min_size=1, max_size=10), "arguments": json_values}),
            max_size=2,
        ),
        name=st.none() | st.text(max_size=10),
        meta=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
    ),
    max_size=8,
)
sessions = st.builds(
    SessionFile,
    name=st.text(min_size=1, max_size=30),
    model=st.text(min_size=1, max_size=30),
    mode=st.sampled_from(["chat", "json", "tool"]),
    system_prompt=st.none() | st.text(max_size=100),
    json_schema=st.none() | st.dictionaries(st.text(max_size=8), json_values, max_size=3),
    tools=st.lists(st.text(min_size=1, max_size=12), max_size=3),
    messages=messages,
    notes=st.text(max_size=100),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(session=sessions)
def test_random_sessions_survive_save_and_load(tmp_path, session):
    path = save_session(session, tmp_path / "s.json")
    again = load_session(path)
    assert again.model_dump() == session.model_dump()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    session=sessions,
    edits=st.lists(
        st.tuples(st.sampled_from(["flip", "cut", "insert"]), st.integers(0, 10**6), st.integers(0, 255)),
        min_size=1,
        max_size=4,
    ),
)
def test_corrupted_files_never_crash_the_loader_nor_change(tmp_path, session, edits):
    path = save_session(session, tmp_path / "s.json")
    data = bytearray(path.read_bytes())
    for kind, pos, byte in edits:
        pos %= max(len(data), 1)
        if kind == "flip" and data:
            data[pos] ^= byte or 1
        elif kind == "cut":
            del data[pos:]
        else:
            data[pos:pos] = bytes([byte])
    path.write_bytes(bytes(data))
    try:
        load_session(path)
    except SessionError as exc:
        assert "\n" not in str(exc)
    assert path.read_bytes() == bytes(data)


def test_the_example_sessions_in_the_repository_load():
    examples = sorted(Path(__file__).resolve().parents[2].joinpath("sessions").glob("example*.json"))
    assert examples
    for path in examples:
        assert load_session(path).messages


def test_tool_choice_and_active_branch_round_trip(tmp_path):
    s = SessionFile(
        name="t",
        model=MODEL,
        mode="tool",
        tools=["calculator"],
        tool_choice={"name": "calculator"},
        active_branch_label="edited",
        active_branch_index=1,
    )
    again = load_session(save_session(s, tmp_path / "t.json"))
    assert again.tool_choice == {"name": "calculator"} and again.tools == ["calculator"]
    assert (again.active_branch_label, again.active_branch_index) == ("edited", 1)
