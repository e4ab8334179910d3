#!/usr/bin/env python3
"""A minimal custom-channel integrator, Python 3 standard library only.

    python3 integrator.py [serve] [--port 9000]
        The integrator's endpoint: prints each agent reply the hub posts to
        http://127.0.0.1:9000/replies/<public_id> and answers {"result":"ok"}.

    python3 integrator.py say ENDPOINT_URL CUSTOMER_ID TEXT [--name NAME]
        Posts a customer message to the channel's endpoint URL (from
        `hub channel list`) and prints the hub's answer.
"""

import argparse
import http.server
import json
import sys
import urllib.error
import urllib.request


class Replies(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else self._read_chunked()
        public_id = self.path.rsplit("/", 1)[-1]
        try:
            reply = json.loads(body)
        except ValueError:
            reply = None
        if isinstance(reply, dict):
            sender = (reply.get("sender") or {}).get("name", "?")
            recipient = (reply.get("recipient") or {}).get("id")
            message = reply.get("message") or {}
            shown = message.get("text") or message.get("file") or message.get("type")
            print(
                f"[{public_id}] {sender} -> customer {recipient!r}: {shown}"
                f"  (delivery {self.headers.get('X-Hub-Delivery')},"
                f" attempt {self.headers.get('X-Hub-Attempt')})",
                flush=True,
            )
        else:
            print(f"[{public_id}] not JSON: {body!r}", flush=True)
        answer = b'{"result":"ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def _read_chunked(self):
        # Channels created with `chunked = true` send Transfer-Encoding: chunked.
        body = b""
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                self.rfile.readline()
                return body
            body += self.rfile.read(size)
            self.rfile.readline()

    def log_message(self, *args):
        pass  # one line per reply is printed above


def serve(port):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Replies)
    print(f"integrator listening on http://127.0.0.1:{port}/replies", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


def say(endpoint, customer_id, text, name):
    sender = {"id": int(customer_id) if customer_id.isdigit() else customer_id}
    if name:
        sender["name"] = name
    body = json.dumps({"sender": sender, "message": {"type": "text", "text": text}})
    request = urllib.request.Request(
        endpoint,
        data=body.encode(),
        headers={"Content-Type": "application/json; charset=utf-8"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            print(answer.status, answer.read().decode())
    except urllib.error.HTTPError as e:
        print(e.code, e.read().decode())
        return 1
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command")
    serve_cmd = commands.add_parser("serve", help="print agent replies (the default)")
    serve_cmd.add_argument("--port", type=int, default=9000)
    say_cmd = commands.add_parser("say", help="post a customer message")
    say_cmd.add_argument("endpoint", help="the channel's endpoint URL")
    say_cmd.add_argument("customer_id")
    say_cmd.add_argument("text")
    say_cmd.add_argument("--name")
    args = parser.parse_args()
    if args.command == "say":
        return say(args.endpoint, args.customer_id, args.text, args.name)
    serve(getattr(args, "port", 9000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
