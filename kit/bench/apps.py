"""The baselines, each served by uvicorn over TLS exactly as our services are served.

``python -m bench.apps raw|fastapi --port P --cert-file C --key-file K``

- ``raw``: a minimal ASGI callable. It reads the body and returns a fixed allowed
  AdmissionReview: the floor of uvicorn + TLS + HTTP/1.1 on this machine.
- ``fastapi``: a bare FastAPI app with one POST route that reads the body and returns the same
  fixed review: what FastAPI itself costs.

Both use the uvicorn settings of ``common.serving.ServiceRunner``: HTTP parser "auto" (httptools),
TLS >= 1.2 with ALPN http/1.1, keep-alive 30 s, no access log, and the server started with
``asyncio.run(server.serve())``, so the standard-library event loop, as ``ServiceRunner.run``
does. ``--loop uvloop`` runs the same app on uvloop instead (an informative extra row).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response  # module level: FastAPI resolves the handler's annotations here

ALLOWED = json.dumps(
    {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "", "allowed": True}},
    separators=(",", ":"),
).encode()
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ALLOWED)).encode())]


async def raw_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ALLOWED})


def fastapi_app() -> Any:
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/validate")
    async def validate(request: Request) -> Response:
        await request.body()
        return Response(ALLOWED, media_type="application/json")

    return app


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The same server context as ``common.certificates.ServingCertificate``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    context.load_cert_chain(cert_file, key_file)
    return context


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.apps")
    parser.add_argument("app", choices=["raw", "fastapi"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert-file", required=True)
    parser.add_argument("--key-file", required=True)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args()
    app = raw_app if args.app == "raw" else fastapi_app()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=args.port, log_config=None, access_log=False, lifespan="off", timeout_keep_alive=30
    )
    config.load()
    config.ssl = tls_context(args.cert_file, args.key_file)
    server = uvicorn.Server(config)
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(server.serve())
    else:
        asyncio.run(server.serve())


if __name__ == "__main__":
    main()
