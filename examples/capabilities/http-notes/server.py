"""A small notes service: GET /notes lists them, POST /notes adds the body as one note.

It listens on 127.0.0.1:8080 inside its sandbox, which has no network: clients reach it
through the socket skillbox forwards (`skillbox cap start http-notes` prints it).
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_NOTE = 64 * 1024
notes = []


class Notes(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/notes":
            self.reply(200, {"notes": notes})
        elif self.path == "/healthz":
            self.reply(200, {"ok": True})
        else:
            self.reply(404, {"error": f"no route {self.path}"})

    def do_POST(self):
        if self.path != "/notes":
            self.reply(404, {"error": f"no route {self.path}"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_NOTE:
            self.reply(413, {"error": f"a note is at most {MAX_NOTE} bytes"})
            return
        note = self.rfile.read(length).decode("utf-8", "replace")
        notes.append(note)
        self.reply(201, {"id": len(notes), "note": note})

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 8080), Notes)
    print("notes: listening on 127.0.0.1:8080", file=sys.stderr, flush=True)
    server.serve_forever()
