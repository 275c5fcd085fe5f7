"""Attachments: files read into a user message as named fenced blocks (chat/attachments.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixchat.chat.attachments import (
    MAX_FILE_BYTES,
    Attachment,
    AttachmentError,
    complete_path,
    compose_message,
    mentioned_files,
    read_attachment,
    read_mentioned,
)


def minimal_pdf(text: str) -> bytes:
    """A one-page PDF whose page shows ``text`` (Helvetica), written by hand with a correct xref table."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
        b" /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def test_a_code_file_becomes_a_named_block_in_its_language(tmp_path: Path) -> None:
    path = tmp_path / "hello.py"
    path.write_text("print('hi')\n")
    att = read_attachment(path, "hello.py")
    assert att == Attachment("hello.py", "print('hi')\n", "text", "python")
    assert att.block() == "File: hello.py\n```python\nprint('hi')\n```"


def test_a_plain_text_file_gets_a_bare_fence_and_a_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "notes"
    path.write_text("no newline")
    assert read_attachment(path, "notes").block() == "File: notes\n```\nno newline\n```"


def test_the_fence_is_longer_than_any_backtick_run_inside(tmp_path: Path) -> None:
    path = tmp_path / "README.md"
    path.write_text("# T\n\n````sh\nls\n````\n")
    block = read_attachment(path, "README.md").block()
    assert block.splitlines()[1] == "`````markdown"
    assert block.endswith("\n`````")


def test_the_name_defaults_to_the_path_as_given(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("x")
    assert read_attachment(path).name == str(path)


def test_a_byte_order_mark_and_crlf_line_ends_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "w.txt"
    path.write_bytes(b"\xef\xbb\xbfa\r\nb\r\n")
    assert read_attachment(path).text == "a\nb\n"


def test_a_file_with_nul_bytes_is_refused_as_binary(tmp_path: Path) -> None:
    path = tmp_path / "img.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    with pytest.raises(AttachmentError, match=r"^cannot attach img.png: a binary file"):
        read_attachment(path, "img.png")


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("café".encode("latin-1"))
    with pytest.raises(AttachmentError, match=r"not UTF-8 text \(byte 3\)"):
        read_attachment(path, "latin1.txt")


def test_a_missing_file_or_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AttachmentError, match="^cannot attach nope.txt: no such file$"):
        read_attachment(tmp_path / "nope.txt", "nope.txt")
    with pytest.raises(AttachmentError, match="is a directory$"):
        read_attachment(tmp_path, "dir")


def test_an_unreadable_file_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "secret.txt"
    path.write_text("x")
    path.chmod(0)
    try:
        if path.open("rb"):  # running as root: permissions do not apply
            pytest.skip("permissions are not enforced for this user")
    except PermissionError:
        pass
    with pytest.raises(AttachmentError) as info:
        read_attachment(path, "secret.txt")
    assert str(info.value) == "cannot attach secret.txt: Permission denied"


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    with path.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(AttachmentError, match="is over the .*-byte limit"):
        read_attachment(path, "big.log")


def test_a_pdf_becomes_the_text_of_its_pages(tmp_path: Path) -> None:
    path = tmp_path / "paper.pdf"
    path.write_bytes(minimal_pdf("Radix trees share prefixes"))
    att = read_attachment(path, "paper.pdf")
    assert (att.kind, att.language) == ("pdf", "")
    assert att.text == "Radix trees share prefixes\n"


def test_a_damaged_pdf_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.pdf"
    path.write_bytes(b"%PDF-1.4\n garbage")
    with pytest.raises(AttachmentError, match="^cannot attach broken.pdf: not a readable PDF") as info:
        read_attachment(path, "broken.pdf")
    assert "\n" not in str(info.value)


def test_a_pdf_without_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "scan.pdf"
    path.write_bytes(minimal_pdf(""))
    with pytest.raises(AttachmentError, match="has no text layer"):
        read_attachment(path, "scan.pdf")


def test_the_message_puts_the_attachments_before_the_question() -> None:
    a = Attachment("a.py", "x = 1\n", language="python")
    b = Attachment("b.txt", "hello\n")
    assert compose_message("What does it do?", [a, b]) == (
        "File: a.py\n```python\nx = 1\n```\n\nFile: b.txt\n```\nhello\n```\n\nWhat does it do?"
    )


def test_a_message_without_attachments_is_the_text_itself() -> None:
    assert compose_message("hi", []) == "hi"


def test_attachments_without_a_question_are_the_message() -> None:
    assert compose_message("  ", [Attachment("a", "x")]) == "File: a\n```\nx\n```"


def test_at_words_that_name_files_are_mentions_in_order_each_once(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x")
    (tmp_path / "my notes.md").write_text("y")
    (tmp_path / "sub").mkdir()
    text = 'Compare @a.py with @"my notes.md", ask @alice, not me@a.py; @sub is a folder; again @a.py.'
    assert mentioned_files(text, tmp_path) == ["a.py", "my notes.md"]


def test_mentions_are_read_as_attachments_named_as_written(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    assert read_mentioned("see @a.py", tmp_path) == [Attachment("a.py", "x = 1\n", "text", "python")]


def test_completion_extends_to_what_the_entries_share(tmp_path: Path) -> None:
    for name in ("report-2025.md", "report-2026.md", ".hidden"):
        (tmp_path / name).write_text("x")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("x")
    assert complete_path("rep", tmp_path) == "report-202"
    assert complete_path("report-202", tmp_path) is None  # nothing more they agree on
    assert complete_path("sr", tmp_path) == "src/"
    assert complete_path("src/m", tmp_path) == "src/main.py"
    assert complete_path("zzz", tmp_path) is None
    assert complete_path(".h", tmp_path) == ".hidden"
    assert complete_path("", tmp_path) is None  # report-2025.md, report-2026.md and src/ share nothing
