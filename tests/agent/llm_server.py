"""`ScriptedLLMServer`: a scripted OpenAI-compatible chat-completions server on loopback, for tests, evals and CI.

The server answers POST /v1/chat/completions (and /chat/completions) from a queue of steps:

- `reply(text, finish_reason="stop", usage=None, model=None, reasoning=None)`: a `chat.completion` body;
- `error(status, body=None, headers=None)`: an HTTP error in OpenAI's error shape (`rate_limited(...)`,
  `insufficient_quota()` and `server_error(...)` build common ones);
- `hang(seconds, then=None)`: wait (so the client times out), then serve `then` or close without answering;
- `raw_body(body, status=200)`: any bytes (or a dict sent as JSON) as the body: `malformed_json()` (a body cut
  short, as a proxy that drops the connection sends it) and `empty_choices(usage)` build common ones;
- `reply(..., send_usage=False)`: a completion without a `usage` object, as several local servers send it;
- `trickle(then, interval_s=1.0)`: send the headers, then the body of `then` one byte every `interval_s`.

When the queue is empty, an optional `responder(request_json) -> step` picks the step (content-based replies);
with neither, the server answers HTTP 418 "script exhausted" so a test fails fast instead of retrying. Every
request body is kept in `server.requests` (headers in `server.request_headers`, arrival times in
`server.request_times`). `shutdown()` (or leaving the
`with` block) closes the listening socket, so later requests fail to connect.

    with ScriptedLLMServer([rate_limited(retry_after=0), reply("```python\\n...```")]) as server:
        config = LLMConfig(model="m", base_url=server.base_url, api_key="k")
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "ErrorStep",
    "HangStep",
    "RawStep",
    "ReplyStep",
    "ScriptedLLMServer",
    "Step",
    "TrickleStep",
    "empty_choices",
    "error",
    "hang",
    "insufficient_quota",
    "malformed_json",
    "rate_limited",
    "raw_body",
    "reply",
    "server_error",
    "trickle",
]

logger = logging.getLogger(__name__)

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")


@dataclass(frozen=True)
class ReplyStep:
    text: str
    finish_reason: str = "stop"
    usage: Mapping[str, int] | None = None
    model: str | None = None
    reasoning: str | None = None
    send_usage: bool = True


@dataclass(frozen=True)
class RawStep:
    body: Any
    status: int = 200


@dataclass(frozen=True)
class ErrorStep:
    status: int
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HangStep:
    seconds: float
    then: ReplyStep | ErrorStep | None = None


@dataclass(frozen=True)
class TrickleStep:
    then: ReplyStep | RawStep
    interval_s: float = 1.0


Step = ReplyStep | ErrorStep | HangStep | RawStep | TrickleStep


def reply(
    text: str,
    finish_reason: str = "stop",
    usage: Mapping[str, int] | None = None,
    *,
    model: str | None = None,
    reasoning: str | None = None,
    send_usage: bool = True,
) -> ReplyStep:
    """A successful completion. `usage` keys: prompt_tokens, completion_tokens, [reasoning_tokens, total_tokens];
    by default the words of the prompt and of `text` are counted. `send_usage=False` leaves `usage` out."""
    return ReplyStep(text=text, finish_reason=finish_reason, usage=usage, model=model, reasoning=reasoning,
                     send_usage=send_usage)


def raw_body(body: Any, status: int = 200) -> RawStep:
    """`body` as it is (bytes, str) or as JSON (anything else), with `status`."""
    return RawStep(body=body, status=status)


def malformed_json() -> RawStep:
    """HTTP 200 with a chat completion cut off mid-string: not valid JSON."""
    return RawStep(body=b'{"id": "chatcmpl-cut", "object": "chat.completion", "choices": [{"index": 0, '
                        b'"message": {"role": "assistant", "content": "def kernel_fun')


def empty_choices(usage: Mapping[str, int] | None = None) -> RawStep:
    """HTTP 200 with `"choices": []` and, when given, a `usage` object (what a filtered or failed reply looks
    like on several servers)."""
    body: dict[str, Any] = {"id": "chatcmpl-empty", "object": "chat.completion", "created": int(time.time()),
                            "model": "scripted-model", "choices": []}
    if usage is not None:
        body["usage"] = dict(usage)
    return RawStep(body=body)


def trickle(then: ReplyStep | RawStep, interval_s: float = 1.0) -> TrickleStep:
    """Send the headers of `then` at once, then its body one byte every `interval_s` seconds (stops when the
    client goes away or the server shuts down)."""
    return TrickleStep(then=then, interval_s=interval_s)


def error(status: int, body: Any = None, headers: Mapping[str, str] | None = None) -> ErrorStep:
    """An HTTP error; `body` (a dict is sent as JSON) defaults to OpenAI's error shape."""
    return ErrorStep(status=status, body=body, headers=dict(headers or {}))


def rate_limited(retry_after: float | str | None = None, *, retry_after_ms: float | None = None) -> ErrorStep:
    """HTTP 429 with optional `Retry-After` (seconds or an HTTP date) / `retry-after-ms` headers."""
    headers: dict[str, str] = {}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    if retry_after_ms is not None:
        headers["retry-after-ms"] = str(retry_after_ms)
    body = _error_body("Rate limit reached for requests", "requests", "rate_limit_exceeded")
    return ErrorStep(status=429, body=body, headers=headers)


def insufficient_quota() -> ErrorStep:
    """HTTP 429 `insufficient_quota`, as OpenAI sends it when the account is out of credit."""
    body = _error_body("You exceeded your current quota, please check your plan and billing details.",
                       "insufficient_quota", "insufficient_quota")
    return ErrorStep(status=429, body=body, headers={})


def server_error(status: int = 500) -> ErrorStep:
    return ErrorStep(status=status, body=_error_body("The server had an error", "server_error", None), headers={})


def hang(seconds: float, then: ReplyStep | ErrorStep | None = None) -> HangStep:
    """Hold the request for `seconds` (released early on shutdown), then serve `then` or drop the connection."""
    return HangStep(seconds=seconds, then=then)


def _error_body(message: str, type_: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _count_words(value: Any) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, Mapping):
        return sum(_count_words(v) for v in value.values())
    if isinstance(value, list):
        return sum(_count_words(v) for v in value)
    return 0


class ScriptedLLMServer:
    """A loopback OpenAI-compatible server that follows a script (see the module docstring)."""

    def __init__(
        self,
        script: Iterable[Step] = (),
        *,
        responder: Callable[[dict[str, Any]], Step] | None = None,
        model: str = "scripted-model",
    ) -> None:
        self._steps: deque[Step] = deque(script)
        self.responder = responder
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self.request_times: list[float] = []  # time.monotonic() at each request's arrival
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    # -- script ----------------------------------------------------------------------------------------------
    def push(self, *steps: Step) -> None:
        """Append steps to the script."""
        with self._lock:
            self._steps.extend(steps)

    @property
    def pending_steps(self) -> int:
        with self._lock:
            return len(self._steps)

    def _next_step(self, request_json: dict[str, Any]) -> Step | None:
        with self._lock:
            if self._steps:
                return self._steps.popleft()
        if self.responder is not None:
            return self.responder(request_json)
        return None

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> ScriptedLLMServer:
        if self._httpd is not None:
            return self
        handler = type("ScriptedHandler", (_Handler,), {"scripted": self})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._port = httpd.server_address[1]
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="scripted-llm-server", daemon=True
        )
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop serving and close the listening socket (later requests fail to connect); release hangs."""
        self._stopping.set()
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ScriptedLLMServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("ScriptedLLMServer is not started; use it as a context manager or call start()")
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- responses -------------------------------------------------------------------------------------------
    def _completion_body(self, step: ReplyStep, request_json: dict[str, Any], index: int) -> dict[str, Any]:
        if step.usage is not None:
            prompt = int(step.usage.get("prompt_tokens", 0))
            completion = int(step.usage.get("completion_tokens", 0))
            reasoning = step.usage.get("reasoning_tokens")
            total = int(step.usage.get("total_tokens", prompt + completion))
        else:
            prompt = _count_words(request_json.get("messages", []))
            completion = _count_words(step.text)
            reasoning, total = None, prompt + completion
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}
        if reasoning is not None:
            usage["completion_tokens_details"] = {"reasoning_tokens": int(reasoning)}
        message: dict[str, Any] = {"role": "assistant", "content": step.text}
        if step.reasoning is not None:
            message["reasoning_content"] = step.reasoning
        body = {
            "id": f"chatcmpl-scripted-{index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": step.model or request_json.get("model") or self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": step.finish_reason, "logprobs": None}],
            "usage": usage,
        }
        if not step.send_usage:
            del body["usage"]
        return body

    def _payload(self, step: ReplyStep | RawStep, request_json: dict[str, Any], index: int) -> tuple[int, bytes]:
        """Status and body bytes of a reply or raw step."""
        if isinstance(step, ReplyStep):
            return 200, json.dumps(self._completion_body(step, request_json, index)).encode("utf-8")
        body = step.body
        if isinstance(body, str):
            body = body.encode("utf-8")
        elif not isinstance(body, bytes):
            body = json.dumps(body).encode("utf-8")
        return step.status, body


class _Handler(BaseHTTPRequestHandler):
    scripted: ScriptedLLMServer
    protocol_version = "HTTP/1.0"  # one request per connection: nothing lingers after shutdown

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature of the base class
        logger.debug("scripted LLM server: " + format, *args)

    def _trickle(self, status: int, payload: bytes, interval_s: float) -> None:
        stopping = self.scripted._stopping
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.flush()
            for i in range(len(payload)):
                if stopping.wait(interval_s):
                    return
                self.wfile.write(payload[i:i + 1])
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            logger.debug("scripted LLM server: client went away during a trickle")

    def _send(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        payload = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            logger.debug("scripted LLM server: client went away before the reply")

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        server = self.scripted
        if self.path.split("?", 1)[0] not in CHAT_PATHS:
            self._send(404, _error_body(f"no route {self.path}; use {CHAT_PATHS}", "invalid_request_error", None))
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            request_json = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError as exc:
            self._send(400, _error_body(f"request body is not JSON: {exc}", "invalid_request_error", None))
            return
        with server._lock:
            server.requests.append(request_json)
            server.request_headers.append({k.lower(): v for k, v in self.headers.items()})
            server.request_times.append(time.monotonic())
            index = len(server.requests)
        if request_json.get("stream"):
            self._send(400, _error_body("ScriptedLLMServer does not stream", "invalid_request_error", None))
            return
        step = server._next_step(request_json)
        if isinstance(step, HangStep):
            server._stopping.wait(step.seconds)
            if step.then is None or server._stopping.is_set():
                return  # drop the connection without an answer
            step = step.then
        if step is None:
            message = f"ScriptedLLMServer: script exhausted at request #{index}; push more steps"
            self._send(418, _error_body(message, "script_exhausted", "script_exhausted"))
        elif isinstance(step, ErrorStep):
            body = step.body if step.body is not None else _error_body(
                f"scripted error {step.status}", "scripted_error", None
            )
            self._send(step.status, body, step.headers)
        elif isinstance(step, (ReplyStep, RawStep)):
            self._send(*server._payload(step, request_json, index))
        elif isinstance(step, TrickleStep):
            self._trickle(*server._payload(step.then, request_json, index), step.interval_s)
        else:
            self._send(500, _error_body(f"bad scripted step {step!r}", "script_error", None))
