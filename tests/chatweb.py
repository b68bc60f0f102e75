"""A loopback OpenAI-compatible `POST /v1/chat/completions`: answers what its script says
(a body, a status, after a delay) and keeps every request it was sent, for contract tests
of the chat clients (the planner, the coverage judge) with the real `openai` client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from webctx.devweb.server import LoopbackServer


@dataclass
class ChatScript:
    """What the loopback chat API answers next, and what it was asked."""

    content: str = "[]"
    status: int = 200
    delay_s: float = 0.0
    trickle_s: float = 0.0
    """Seconds between the bytes of a 200's body (0: sent at once)."""
    answers: list[str] = field(default_factory=list)
    """Contents answered in turn before `content` (one per request)."""
    requests: list[dict[str, object]] = field(default_factory=list)


def _completion(model: str, content: str) -> dict[str, object]:
    message = {"role": "assistant", "content": content}
    choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
    usage = {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": model,
            "choices": [choice], "usage": usage}  # fmt: skip


async def _trickle(body: bytes, pause_s: float) -> AsyncIterator[bytes]:
    for n in range(len(body)):
        await asyncio.sleep(pause_s)
        yield body[n : n + 1]


@contextmanager
def chat_server() -> Iterator[tuple[LoopbackServer, ChatScript]]:
    """A chat API on a loopback port and the script it follows."""
    script = ChatScript()

    async def completions(request: Request) -> Response:
        body = await request.json()
        script.requests.append(body)
        if script.delay_s:
            await asyncio.sleep(script.delay_s)
        if script.status != 200:
            error = {"message": "boom", "type": "server_error", "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=script.status)
        content = script.answers.pop(0) if script.answers else script.content
        answer = JSONResponse(_completion(str(body["model"]), content))
        if not script.trickle_s:
            return answer
        return StreamingResponse(_trickle(bytes(answer.body), script.trickle_s),
                                 media_type="application/json")  # fmt: skip

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    with LoopbackServer(app) as server:
        yield server, script
