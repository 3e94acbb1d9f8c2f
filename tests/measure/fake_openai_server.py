"""A fake OpenAI-compatible streaming server for the engine tests, run as a real subprocess.

    python fake_openai_server.py --port P [--ttft S] [--itl S] [--stall-after N] [--mode MODE] [--child]

Answers ``GET /v1/models`` and ``POST /v1/completions`` with ``stream: true``: waits ``--ttft``
seconds, then sends ``max_tokens`` chunks ``--itl`` seconds apart, a usage chunk and ``[DONE]``.
``--stall-after N``: after N chunks it stops sending (and keeps the connection open).
``--mode exit``: prints a message and exits 3 at once; ``--mode deaf``: never listens;
``--mode slow-ready``: listens but answers /v1/models 503 forever; ``--mode crash``: answers /v1/models,
then on the first completion request prints a line and kills itself with SIGSEGV (an engine kernel that crashes).
``--child``: starts a sleeping child process (in its process group) to check that stopping kills it too;
its pid is written to ``--child-pid-file``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ttft", type=float, default=0.05)
    ap.add_argument("--itl", type=float, default=0.01)
    ap.add_argument("--stall-after", type=int, default=-1)
    ap.add_argument("--mode", default="ok", choices=["ok", "exit", "deaf", "slow-ready", "crash"])
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--child-pid-file", default="")
    args = ap.parse_args()
    print(f"fake server starting on {args.port} mode={args.mode}", flush=True)
    if args.child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        if args.child_pid_file:
            with open(args.child_pid_file, "w") as f:
                f.write(str(child.pid))
    if args.mode == "exit":
        print("error: model file not found: /nonexistent.gguf", flush=True)
        sys.exit(3)
    if args.mode == "deaf":
        time.sleep(600)
        return

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            status = 503 if args.mode == "slow-ready" else 200
            body = json.dumps({"data": [{"id": "fake"}]}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if args.mode == "crash":
                print("ggml_backend_amx_mul_mat: about to crash", flush=True)
                os.kill(os.getpid(), signal.SIGSEGV)
            n = int(req.get("max_tokens", 16))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()

            def send(obj: object) -> None:
                self.wfile.write(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")
                self.wfile.flush()

            time.sleep(args.ttft)
            for i in range(n):
                if i and args.itl:
                    time.sleep(args.itl)
                if i == args.stall_after:
                    time.sleep(600)
                send({"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]})
            send({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}})
            send(b"[DONE]")
            self.close_connection = True

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
