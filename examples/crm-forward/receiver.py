#!/usr/bin/env python3
"""A stand-in CRM for the crm-forward example, Python 3 standard library only.

    python3 receiver.py [--port 9100] [--fail N]

Prints every record the hub forwards to http://127.0.0.1:9100/hub-events,
with its delivery id and attempt, and answers 200 {"result":"ok"}. With
--fail N it answers 503 to the first N requests, to watch the hub retry with
the same X-Hub-Delivery.
"""

import argparse
import http.server
import json
import sys


class Receiver(http.server.BaseHTTPRequestHandler):
    failures_left = 0

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        delivery = self.headers.get("X-Hub-Delivery")
        attempt = self.headers.get("X-Hub-Attempt")
        auth = self.headers.get("Authorization")
        try:
            shown = json.dumps(json.loads(body), indent=2, ensure_ascii=False)
        except ValueError:
            shown = repr(body)
        print(
            f"--- {self.path}  delivery {delivery}  attempt {attempt}  authorization {auth!r}",
            flush=True,
        )
        print(shown, flush=True)
        if Receiver.failures_left > 0:
            Receiver.failures_left -= 1
            self.answer(503, b"busy, try again")
        else:
            self.answer(200, b'{"result":"ok"}')

    def answer(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass  # each record is printed above


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--fail", type=int, default=0, help="answer 503 to the first N requests")
    args = parser.parse_args()
    Receiver.failures_left = args.fail
    server = http.server.HTTPServer(("127.0.0.1", args.port), Receiver)
    print(f"CRM receiver listening on http://127.0.0.1:{args.port}/hub-events", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
