"""Cross-origin calls to the language-model routes, allowed as Ollama allows them.

Browser front ends, editor extensions and desktop apps (Electron, Tauri, VS Code webviews) call
a local model server from a page of their own origin, after a CORS preflight. Ollama answers
those from the loopback host and from ``app://``, ``file://``, ``tauri://``,
``vscode-webview://`` and ``vscode-file://`` pages by default, further origins by
``OLLAMA_ORIGINS``; here by ``[http] cors_origins``. Only the language-model routes take part:
a page never gets to drive the board (DVFS profiles, model loading, config) from a browser.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

LOCAL_ORIGINS = (r"^(https?://(localhost|127\.0\.0\.1|\[::1\]|0\.0\.0\.0)(:\d+)?"
                 r"|(app|file|tauri|vscode-webview|vscode-file)://.*)$")
LLM_ROUTES = ("/api/", "/v1/chat/completions", "/v1/completions", "/v1/responses",
              "/v1/embeddings", "/v1/models")


class LlmCors:
    """CORS (preflights answered, ``Access-Control-Allow-Origin`` set) on the language-model
    routes and Ollama's ``/`` heartbeat; every other route as it is."""

    def __init__(self, app: ASGIApp, origins: Sequence[str] = ()) -> None:
        self.app = app
        self.cors = CORSMiddleware(app, allow_origins=list(origins),
                                   allow_origin_regex=LOCAL_ORIGINS,
                                   allow_methods=["GET", "HEAD", "POST", "DELETE", "OPTIONS"],
                                   allow_headers=["*"], max_age=600)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] == "http" and (path == "/" or path.startswith(LLM_ROUTES)):
            await self.cors(scope, receive, send)
        else:
            await self.app(scope, receive, send)
