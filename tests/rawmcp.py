"""MCP clients that speak the wire exactly as the schema writes it, with no SDK between:
newline-delimited JSON-RPC over a server's stdin/stdout, and single POSTs to a streamable
HTTP endpoint. Protocol 2026-07-28: every request carries its `_meta` envelope (protocol
version, client info, client capabilities); the tasks extension is declared per request.
Used to check what a server answers, byte for byte, where an SDK would hide it."""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

VERSION = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
WITH_TASKS: dict[str, Any] = {"extensions": {TASKS: {}}}
CLIENT_INFO = {"name": "raw-test-client", "version": "1"}


def envelope(
    params: Mapping[str, Any] | None, capabilities: Mapping[str, Any] | None
) -> dict[str, Any]:
    """`params` with the 2026-07-28 `_meta` envelope (`capabilities` None: no envelope)."""
    out = dict(params or {})
    if capabilities is not None:
        meta = {"protocolVersion": VERSION, "clientInfo": CLIENT_INFO,
                "clientCapabilities": dict(capabilities)}  # fmt: skip
        out["_meta"] = {**out.get("_meta", {}),
                        **{f"io.modelcontextprotocol/{k}": v for k, v in meta.items()}}  # fmt: skip
    return out


class RawStdio:
    """A server process spoken to in newline-delimited JSON-RPC; every line it writes is
    kept (`lines`), notifications included."""

    def __init__(self, args: Sequence[str], *, env: Mapping[str, str], cwd: str) -> None:
        self._stderr = tempfile.TemporaryFile()  # what the server logs, for failures
        self.proc = subprocess.Popen(list(args), env=dict(env), cwd=cwd, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr,
                                     text=True, bufsize=1)  # fmt: skip
        self.lines: list[dict[str, Any]] = []
        self._answers: dict[int, dict[str, Any]] = {}
        self._arrived = threading.Condition()
        self._next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.strip():
                continue
            message = json.loads(line)
            with self._arrived:
                self.lines.append(message)
                if "id" in message and ("result" in message or "error" in message):
                    self._answers[message["id"]] = message
                self._arrived.notify_all()

    def send(self, message: Mapping[str, Any]) -> None:
        """Write one JSON-RPC message as one line."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: Mapping[str, Any] | None = None, *,
                capabilities: Mapping[str, Any] | None = WITH_TASKS,
                timeout_s: float = 120) -> dict[str, Any]:  # fmt: skip
        """Send a request and return the whole response (`result` or `error`)."""
        self._next_id += 1
        number = self._next_id
        self.send({"jsonrpc": "2.0", "id": number, "method": method,
                   "params": envelope(params, capabilities)})  # fmt: skip
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while number not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"no answer to {method} (server exit"
                                         f" {self.proc.poll()}): {self.log()[-3000:]}")  # fmt: skip
                self._arrived.wait(min(left, 0.5))  # and see a server that died meanwhile
            return self._answers.pop(number)

    def log(self) -> str:
        """What the server wrote to stderr so far."""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def notifications(self, method: str) -> list[dict[str, Any]]:
        """Every notification with this method the server wrote so far."""
        with self._arrived:
            return [m for m in self.lines if m.get("method") == method and "id" not in m]

    def close(self) -> None:
        """Close stdin (the client is done) and wait for the server to leave."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL the server process."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


class RawHttp:
    """Streamable HTTP at 2026-07-28: one POST per request, routing headers as the spec and
    the tasks extension write them (`Mcp-Method`, `Mcp-Name` for a tool or a task)."""

    def __init__(self, url: str, *, key: str | None) -> None:
        self.url = url
        self.key = key
        self._next_id = 0

    def request(self, method: str, params: Mapping[str, Any] | None = None, *,
                capabilities: Mapping[str, Any] | None = WITH_TASKS,
                timeout_s: float = 120) -> dict[str, Any]:  # fmt: skip
        """POST one request; the JSON-RPC response (from a JSON or an SSE body)."""
        self._next_id += 1
        params = envelope(params, capabilities)
        headers = {"Accept": "application/json, text/event-stream",
                   "MCP-Protocol-Version": VERSION, "Mcp-Method": method}  # fmt: skip
        name = params.get("taskId") if method.startswith("tasks/") else params.get("name")
        if isinstance(name, str) and method in ("tools/call", "tasks/get", "tasks/update",
                                                 "tasks/cancel"):  # fmt: skip
            headers["Mcp-Name"] = name
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        body = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        resp = httpx.post(self.url, json=body, headers=headers, timeout=timeout_s)
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            for line in resp.text.splitlines():
                if line.startswith("data:"):
                    message = json.loads(line[5:])
                    if message.get("id") == self._next_id:
                        return dict(message)
            raise AssertionError(f"no answer in the event stream: {resp.text[:500]}")
        return dict(resp.json())


def poll(client: RawStdio | RawHttp, task_id: str, *, timeout_s: float = 150,
         until: Sequence[str] = ("completed", "failed", "cancelled"),
         stop: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """`tasks/get` at the task's `pollIntervalMs` until its status is one of `until` (or
    `stop` says so): every answer's result, the last one the one that ended it."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = client.request("tasks/get", {"taskId": task_id})
        assert "result" in answer, answer
        task = answer["result"]
        seen.append(task)
        if task["status"] in until or (stop is not None and stop(task)):
            return seen
        time.sleep(task.get("pollIntervalMs", 1000) / 1000)
    raise AssertionError(f"task {task_id} still {seen[-1] if seen else '?'}")
