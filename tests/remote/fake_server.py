"""A scripted OpenAI-compatible server on loopback, for what a real server cannot be made to do on demand:
answer 429 then succeed, drop the connection mid-stream, stay silent past the client's timeout, cut a
stream short the way llama-cpp-python's server does when another request arrives.

Standard library only (one thread per connection). Streams are sent with chunked transfer encoding, as
uvicorn does, so a dropped connection is an incomplete body to the client, not a clean end.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Stream:
    """A 200 SSE stream: ``deltas`` as content chunks, then ``finish``, then usage if asked for."""

    deltas: list[str] = field(default_factory=lambda: ["Hello", " there", "!"])
    # Thinking, streamed before the content in ``delta.<reasoning_key>`` (vLLM's and SGLang's
    # ``reasoning_content``; some servers say ``reasoning``).
    reasoning: list[str] = field(default_factory=list)
    reasoning_key: str = "reasoning_content"
    finish: str | None = "stop"  # None: end the stream (cleanly) without a finish reason
    usage: dict[str, Any] | None = field(
        default_factory=lambda: {
            "prompt_tokens": 20,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 12},
        }
    )
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {"name": ..., "arguments": "{...}"}
    repeat_name: bool = False  # send the call's name with every arguments chunk, as llama.cpp's server does
    delay_first: float = 0.0  # after the role chunk, before the first content
    delay_each: float = 0.0
    drop_after: int | None = None  # close the socket after this many content chunks
    # End the stream cleanly after this many content chunks: "[DONE]" with no finish reason, as
    # llama-cpp-python's server does to a running request when another one arrives.
    interrupted_after: int | None = None


@dataclass
class Status:
    """An error answer: ``code`` with an OpenAI-style error body."""

    code: int
    message: str = "scripted error"
    headers: dict[str, str] = field(default_factory=dict)


Behaviour = Stream | Status


class FakeServer:
    def __init__(self, models: tuple[str, ...] = ("fake-model",)) -> None:
        self.models = list(models)
        self.script: list[Behaviour] = []  # consumed first, one per chat request
        self.by_text: dict[str, Behaviour] = {}  # else: the first key found in the last message's content
        self.default: Behaviour = Stream()
        self.requests: list[dict[str, Any]] = []  # {"path", "headers" (lower-case names), "body"} of each
        self.disconnects = 0  # streams the client went away from
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"].endswith("/chat/completions")]

    def start(self) -> FakeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def choose(self, body: dict[str, Any]) -> Behaviour:
        with self._lock:
            if self.script:
                return self.script.pop(0)
        content = str((body.get("messages") or [{}])[-1].get("content") or "")
        for key, behaviour in self.by_text.items():
            if key in content:
                return behaviour
        return self.default

    def wait_for_disconnect(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.disconnects:
                return True
            time.sleep(0.02)
        return False


def _handler(server: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _record(self, body: Any) -> None:
            with server._lock:
                server.requests.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                    }
                )

        def _json(self, code: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._record(None)
            if self.path.rstrip("/") == "/v1/models":  # only under /v1, as real servers
                data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in server.models]
                self._json(200, {"object": "list", "data": data})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            self._record(body)
            if not self.path.endswith("/chat/completions"):
                self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            behaviour = server.choose(body)
            if isinstance(behaviour, Status):
                err = {"error": {"message": behaviour.message, "type": "error", "code": behaviour.code}}
                self._json(behaviour.code, err, behaviour.headers)
                return
            try:
                self._stream(behaviour, body)
            except (BrokenPipeError, ConnectionResetError):
                with server._lock:
                    server.disconnects += 1
                self.close_connection = True

        def _chunk(self, payload: dict[str, Any] | str) -> None:
            text = payload if isinstance(payload, str) else json.dumps(payload)
            data = f"data: {text}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _event(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": server.models[0],
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        def _stream(self, s: Stream, body: dict[str, Any]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk(self._event({"role": "assistant", "content": ""}))
            time.sleep(s.delay_first)
            for text in s.reasoning:
                self._chunk(self._event({s.reasoning_key: text}))
                time.sleep(s.delay_each)
            for i, text in enumerate(s.deltas):
                if s.drop_after is not None and i >= s.drop_after:
                    self._drop()
                    return
                if s.interrupted_after is not None and i >= s.interrupted_after:
                    self._chunk("[DONE]")
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    return
                self._chunk(self._event({"content": text}))
                time.sleep(s.delay_each)
            for i, call in enumerate(s.tool_calls):
                first = {
                    "index": i,
                    "id": f"call_fake_{i}",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": ""},
                }
                self._chunk(self._event({"tool_calls": [first]}))
                args = call["arguments"]
                for part in (args[: len(args) // 2], args[len(args) // 2 :]):
                    function = {"arguments": part, **({"name": call["name"]} if s.repeat_name else {})}
                    self._chunk(self._event({"tool_calls": [{"index": i, "function": function}]}))
            if s.finish is not None:
                self._chunk(self._event({}, s.finish))
                if s.usage is not None and (body.get("stream_options") or {}).get("include_usage"):
                    usage = {"total_tokens": 0, **s.usage}
                    self._chunk(
                        {
                            "id": "chatcmpl-fake",
                            "object": "chat.completion.chunk",
                            "created": 0,
                            "model": server.models[0],
                            "choices": [],
                            "usage": usage,
                        }
                    )
                self._chunk("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _drop(self) -> None:
            """Vanish mid-body: no terminating chunk, the socket just closes."""
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True

    return Handler


def main() -> None:
    """Serve a thinking model's replies until interrupted (for trying the app by hand in a terminal):
    ``python tests/remote/fake_server.py`` prints the URL to give ``radixchat --backend``."""
    import sys

    server = FakeServer().start()
    words = [
        "Let",
        "me",
        "think",
        "about",
        "this.",
        "The",
        "user",
        "greets",
        "me,",
        "so",
        "I",
        "greet",
        "back.",
    ]
    server.default = Stream(
        deltas=["Hello", " there", "! How can I help?"],
        reasoning=[w + " " for w in words],
        delay_each=float(sys.argv[1]) if len(sys.argv) > 1 else 0.15,
        usage={
            "prompt_tokens": 20,
            "completion_tokens": 20,
            "completion_tokens_details": {"reasoning_tokens": 17},
        },
    )
    print(server.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
