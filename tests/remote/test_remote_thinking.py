"""A thinking model behind a server: ``reasoning_content`` (or ``reasoning``) streams as thinking, apart
from the answer, in the backend, the batch records and ``-p``; the answer alone goes back to the server."""

from __future__ import annotations

import io
import json

from radixchat.chat.thinking import ThinkingDelta
from radixchat.cli import main
from radixchat.sampling import SamplingParams
from tests.remote.fake_server import Stream

PARAMS = SamplingParams(max_tokens=32, temperature=0.0)
USAGE = {"prompt_tokens": 20, "completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": 6}}


def thinking_stream(key: str = "reasoning_content") -> Stream:
    return Stream(
        reasoning=["They ", "greet ", "me."], deltas=["Hello", " there!"], reasoning_key=key, usage=USAGE
    )


async def test_reasoning_content_streams_as_thinking_and_is_kept_apart(make_backend, fake):
    fake.default = thinking_stream()
    backend = make_backend()
    conv = backend.new_conversation()
    conv.add_user("Hi")
    reply = backend.reply(conv, PARAMS)
    deltas = [d async for d in reply]
    result = await reply.result()
    assert [(type(d) is ThinkingDelta, str(d)) for d in deltas] == [
        (True, "They "),
        (True, "greet "),
        (True, "me."),
        (False, "Hello"),
        (False, " there!"),
    ]
    assert (result.message.content, result.message.reasoning) == ("Hello there!", "They greet me.")
    assert result.reasoning_tokens == 6 and "thinking 6 · answer 3" in result.footer()

    conv.add_user("More")  # the next request sends the answer back, not the thinking
    await backend.reply(conv, PARAMS).result()
    sent = fake.chat_requests[-1]["body"]["messages"]
    assert sent[1] == {"role": "assistant", "content": "Hello there!"}


async def test_a_server_saying_reasoning_or_sending_think_tags_in_the_content_is_understood(
    make_backend, fake
):
    backend = make_backend()
    fake.default = thinking_stream("reasoning")
    first = backend.new_conversation()
    first.add_user("Hi")
    result = await backend.reply(first, PARAMS).result()
    assert (result.message.content, result.message.reasoning) == ("Hello there!", "They greet me.")

    # No reasoning parser on the server: the tags come in the content, split across chunks.
    fake.default = Stream(deltas=["<thi", "nk>\nHmm.\n</th", "ink>\n\n", "Hi!"])
    conv = backend.new_conversation()
    conv.add_user("Hi")
    reply = backend.reply(conv, PARAMS)
    deltas = [d async for d in reply]
    result = await reply.result()
    assert "".join(d for d in deltas if isinstance(d, ThinkingDelta)) == "Hmm.\n"
    assert (result.message.content, result.message.reasoning) == ("Hi!", "Hmm.")


def test_batch_records_carry_the_reasoning_beside_the_reply(fake, tmp_path, capsys):
    fake.default = thinking_stream()
    fake.by_text["plain"] = Stream(deltas=["Just ", "this."])
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"id": "a", "turns": ["Hi", "plain please"]}) + "\n")
    assert main(["--backend", fake.url, "--batch", str(path)]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["reply"], r["reasoning"]) for r in records] == [
        ("Hello there!", "They greet me."),
        ("Just this.", None),
    ]
    assert records[0]["usage"]["reasoning_tokens"] == 6 and "reasoning_tokens" not in records[1]["usage"]


def test_oneshot_prints_the_answer_and_shows_thinking_on_stderr_when_asked(fake, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))  # nothing piped in
    fake.default = thinking_stream()
    assert main(["--backend", fake.url, "-p", "Hi"]) == 0
    out, err = capsys.readouterr()
    assert out == "Hello there!\n" and "greet" not in err
    assert main(["--backend", fake.url, "-p", "Hi", "--show-thinking"]) == 0
    out, err = capsys.readouterr()
    assert out == "Hello there!\n" and err == "They greet me.\n"  # not a terminal: no dimming codes


def test_show_thinking_needs_a_prompt(capsys):
    assert main(["--show-thinking"]) == 2
    assert "--show-thinking needs -p" in capsys.readouterr().err
