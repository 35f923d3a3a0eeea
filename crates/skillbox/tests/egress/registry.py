"""A package registry for the egress tests, on one address and port: a PyPI simple
index with one wheel, and an npm registry with one package, both built here from the
standard library. It prints its port on stdout, then logs each request path to stderr.

    python3 registry.py ADDRESS
"""
import base64, hashlib, http.server, io, json, socketserver, sys, tarfile, zipfile

ADDRESS = sys.argv[1]
NAME = "skillbox-egress-probe"
MODULE = "skillbox_egress_probe"
VERSION = "1.0.0"


def wheel():
    files = {
        f"{MODULE}/__init__.py": b'VALUE = "pip-probe-ok"\n',
        f"{MODULE}-{VERSION}.dist-info/METADATA":
            f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n".encode(),
        f"{MODULE}-{VERSION}.dist-info/WHEEL":
            b"Wheel-Version: 1.0\nGenerator: skillbox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{path},sha256={digest},{len(data)}\n"
    record += f"{MODULE}-{VERSION}.dist-info/RECORD,,\n"
    files[f"{MODULE}-{VERSION}.dist-info/RECORD"] = record.encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return out.getvalue()


def tarball():
    files = {
        "package/package.json": json.dumps({"name": NAME, "version": VERSION, "main": "index.js"}).encode(),
        "package/index.js": b'module.exports = "npm-probe-ok";\n',
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as t:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


WHEEL_NAME = f"{MODULE}-{VERSION}-py3-none-any.whl"
WHEEL = wheel()
TARBALL = tarball()


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send(self, body, kind):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        print(self.path, file=sys.stderr, flush=True)
        host = self.headers.get("Host") or ADDRESS
        path = self.path.split("?")[0]
        if path in (f"/simple/{NAME}/", f"/simple/{MODULE}/"):
            digest = hashlib.sha256(WHEEL).hexdigest()
            page = f'<html><body><a href="/files/{WHEEL_NAME}#sha256={digest}">{WHEEL_NAME}</a></body></html>'
            return self.send(page.encode(), "text/html")
        if path == f"/files/{WHEEL_NAME}":
            return self.send(WHEEL, "application/octet-stream")
        if path == f"/{NAME}":
            meta = {
                "name": NAME,
                "dist-tags": {"latest": VERSION},
                "versions": {VERSION: {
                    "name": NAME, "version": VERSION, "main": "index.js",
                    "dist": {
                        "tarball": f"http://{host}/{NAME}/-/{NAME}-{VERSION}.tgz",
                        "shasum": hashlib.sha1(TARBALL).hexdigest(),
                        "integrity": "sha512-" + base64.b64encode(hashlib.sha512(TARBALL).digest()).decode(),
                    },
                }},
            }
            return self.send(json.dumps(meta).encode(), "application/json")
        if path == f"/{NAME}/-/{NAME}-{VERSION}.tgz":
            return self.send(TARBALL, "application/octet-stream")
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


server = Server((ADDRESS, 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
