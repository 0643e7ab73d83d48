"""A real OpenAI-compatible HTTP server on loopback, whose replies a test scripts.

``JudgeServer(reply)`` serves ``GET /v1/models`` and ``POST /v1/chat/completions`` on a
free port (``.url`` is ``http://127.0.0.1:PORT/v1``); ``reply(prompt) -> str | int``
gives the message text, or an HTTP status code to answer with instead. It counts the
requests and the most in flight at once. With ``drip_s`` it sends each reply — status
line, headers and body — one byte every ``drip_s`` seconds (a server that is slow, not
silent), stopping when the client hangs up or the server is left. Run as a script, it
serves until killed: ``python judge_server.py PORT first|correct|score`` (the CLI tests
kill it mid-run)."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rlmap.feedback.verifiers import exact_match
from rlmap.tasks.arithmetic import OPERATORS

Reply = Callable[[str], "str | int"]


class JudgeServer:
    def __init__(
        self, reply: Reply, delay_s: float = 0.0, port: int = 0, drip_s: float = 0.0
    ) -> None:
        self.reply, self.delay_s, self.drip_s = reply, delay_s, drip_s
        self.stopping = threading.Event()  # ends every drip when the server is left
        self.requests = 0
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> JudgeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


def _handler(owner: JudgeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "judge", "object": "model"}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with owner.lock:
                owner.requests += 1
                owner.in_flight += 1
                owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
            try:  # the reply is made, and the request leaves the count, before it is sent:
                # a client that has its answer may send the next at once
                time.sleep(owner.delay_s)
                prompt = body["messages"][-1]["content"]
                reply = owner.reply(prompt)
            finally:
                with owner.lock:
                    owner.in_flight -= 1
            if isinstance(reply, int):
                self._send(reply, {"error": "scripted failure"})
                return
            self._send(
                200,
                {
                    "object": "chat.completion",
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": reply},
                        }
                    ],
                    "usage": {
                        "prompt_tokens": len(prompt.split()),
                        "completion_tokens": 1,
                        "total_tokens": len(prompt.split()) + 1,
                    },
                },
            )

        def _send(self, code: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            try:
                if owner.drip_s > 0:
                    self._drip(code, data)
                    return
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout)
                pass

        def _drip(self, code: int, data: bytes) -> None:
            self.close_connection = True
            head = (
                f"HTTP/1.1 {code} {self.responses[code][0]}\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(data)}\r\n"
                "Connection: close\r\n\r\n"
            )
            for byte in head.encode() + data:
                if owner.stopping.wait(owner.drip_s):
                    return
                self.wfile.write(bytes([byte]))

    return Handler


def _correct(task: str, response: str) -> bool:
    """The response is the task's answer (``a+b=``, ``a-b=`` or ``a*b=``; exact match)."""
    found = re.search(r"(\d+)([-+*])(\d+)=", task)
    if found is None:
        return False
    a, op, b = int(found.group(1)), found.group(2), int(found.group(3))
    return exact_match(response, str(OPERATORS[op](a, b))) == 1.0


def _between(prompt: str, start: str, end: str) -> str:
    found = re.search(re.escape(start) + r"\n(.*?)\n\n" + re.escape(end), prompt, re.S)
    return "" if found is None else found.group(1)


def always_first(prompt: str) -> str:
    """A judge with total position bias: it prefers whichever response is shown first."""
    return "A"


def correct_first(prompt: str) -> str:
    """A fair pairwise judge of the arithmetic tasks: prefers the correct response, and
    calls a tie when both or neither is."""
    task = _between(prompt, "Task:", "Response A:")
    a = _correct(task, _between(prompt, "Response A:", "Response B:"))
    b = _correct(task, _between(prompt, "Response B:", "Better response:"))
    return "TIE" if a == b else "A" if a else "B"


def correct_score(prompt: str) -> str:
    """A fair pointwise judge of the arithmetic tasks: 10 for the correct answer, else 2."""
    task = _between(prompt, "Task:", "Response:")
    return "10" if _correct(task, _between(prompt, "Response:", "Rating:")) else "2"


if __name__ == "__main__":
    policies = {"first": always_first, "correct": correct_first, "score": correct_score}
    with JudgeServer(policies[sys.argv[2]], port=int(sys.argv[1])) as s:
        print(s.url, flush=True)
        s.thread.join()
