"""The OpenAI-compatible stand-in servers of the tests share this: a handler that answers a chat
request with a completion record, and stays quiet."""

import json
from http.server import BaseHTTPRequestHandler


def chat_completion(model: str, content: str, finish_reason: str = "stop") -> dict:
    """A chat.completion record with one choice."""
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {"index": 0, "finish_reason": finish_reason, "message": {"role": "assistant", "content": content}}
        ],
    }


class ChatHandler(BaseHTTPRequestHandler):
    """A request handler with ``body()`` (the request's JSON) and ``send_json(value)``; no logging."""

    def body(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def send_json(self, value: dict, status: int = 200) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass
