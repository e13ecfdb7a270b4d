#!/usr/bin/env python3
"""A registry of one image on loopback, for tests: the output of `docker save`
served as the registry v2 API (so a Docker engine can pull it).

Usage: registry.py SAVED.tar   -- prints the port it listens on, then serves
until killed; every request is logged on stderr."""
import gzip
import hashlib
import http.server
import json
import sys
import tarfile


def load(path):
    blobs = {}
    with tarfile.open(path) as t:
        manifest = json.load(t.extractfile("manifest.json"))[0]
        config = t.extractfile(manifest["Config"]).read()
        layers = []
        for name in manifest["Layers"]:
            raw = t.extractfile(name).read()
            gz = gzip.compress(raw, mtime=0)
            digest = "sha256:" + hashlib.sha256(gz).hexdigest()
            blobs[digest] = gz
            layers.append({"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(gz), "digest": digest})
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    blobs[config_digest] = config
    body = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config), "digest": config_digest},
        "layers": layers,
    }).encode()
    return body, "sha256:" + hashlib.sha256(body).hexdigest(), blobs


MANIFEST, MANIFEST_DIGEST, BLOBS = load(sys.argv[1])


class Registry(http.server.BaseHTTPRequestHandler):
    def answer(self, body, kind, digest=None, send=True):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.end_headers()
        if send:
            self.wfile.write(body)

    def route(self, send):
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts == ["v2"]:
            return self.answer(b"{}", "application/json", send=send)
        if len(parts) >= 4 and parts[0] == "v2" and parts[-2] == "manifests":
            return self.answer(MANIFEST, "application/vnd.docker.distribution.manifest.v2+json", MANIFEST_DIGEST, send)
        if len(parts) >= 4 and parts[0] == "v2" and parts[-2] == "blobs" and parts[-1] in BLOBS:
            return self.answer(BLOBS[parts[-1]], "application/octet-stream", parts[-1], send)
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if send:
            self.wfile.write(b'{"errors": [{"code": "NAME_UNKNOWN", "message": "not here"}]}')

    def do_GET(self):
        self.route(True)

    def do_HEAD(self):
        self.route(False)


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Registry)
print(server.server_address[1], flush=True)
server.serve_forever()
