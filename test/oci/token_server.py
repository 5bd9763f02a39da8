#!/usr/bin/env python3
"""A Docker registry token server for test/oci: the bearer-token flow of the
distribution registry (its `auth: token:` config), on loopback.

    token_server.py KEY.pem CERT.pem USER PASSWORD SERVICE ISSUER

GET /token?service=S&scope=repository:NAME:ACTIONS with basic auth USER:PASSWORD
answers {"token": JWT} granting the scope's actions (RS256, signed by KEY, its
certificate CERT in the x5c header, which the registry checks against its
rootcertbundle); missing or wrong credentials answer 401. Prints "listening
PORT" once it serves (port chosen by the kernel).
"""
import base64
import http.server
import json
import sys
import time
import urllib.parse
import uuid

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding

key_file, cert_file, user, password, service, issuer = sys.argv[1:7]
key = serialization.load_pem_private_key(open(key_file, "rb").read(), password=None)
cert = x509.load_pem_x509_certificate(open(cert_file, "rb").read())
cert_der = cert.public_bytes(serialization.Encoding.DER)


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token(scopes):
    header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(cert_der).decode()]}
    now = int(time.time())
    claims = {"iss": issuer, "sub": user, "aud": service, "exp": now + 600, "nbf": now - 10,
              "iat": now, "jti": str(uuid.uuid4()), "access": scopes}
    signing = b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(claims).encode())
    sig = key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
    return signing + "." + b64url(sig)


class handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        if url.path != "/token":
            self.send_error(404)
            return
        want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        if self.headers.get("Authorization") != want:
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"details":"bad credentials"}')
            return
        scopes = []
        for scope in urllib.parse.parse_qs(url.query).get("scope", []):
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            scopes.append({"type": kind, "name": name, "actions": actions.split(",")})
        body = json.dumps({"token": token(scopes)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


server = http.server.HTTPServer(("127.0.0.1", 0), handler)
print("listening", server.server_address[1], flush=True)
server.serve_forever()
