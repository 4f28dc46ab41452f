"""The framing of every socket between the host, a sandbox's server and the code grader's two processes:
a 4-byte big-endian length, then the message as compact JSON. Standard library only.

One copy for both in-sandbox scripts: the host lays this file beside ``server.py`` and ``graded.py``; the
server loads it (as ``posttrain_wire``) before anything else, and the grader takes it from there; on the
host it is ``posttrain.platform.sandbox._wire``. Its functions hold their own references to the builtins
and to json's C parts, taken once here: code that patches the builtins later (graded code, in its own
process) does not change how that process frames its messages.
"""

from __future__ import annotations

import builtins
import json
import socket
import struct

globals().update({name: value for name, value in vars(builtins).items() if not name.startswith("__")})
_encode_json = (
    json.encoder.c_make_encoder(  # type: ignore[attr-defined]
        None, None, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True
    )
    if getattr(json.encoder, "c_make_encoder", None)
    else None
)
_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[attr-defined]  # loaded by json.decoder

HEADER = struct.Struct(">I")
MAX_MESSAGE = 64 << 20


def dumps(obj: object) -> bytes:
    if _encode_json is None:
        return json.dumps(obj, separators=(",", ":")).encode()
    return "".join(_encode_json(obj, 0)).encode()


def loads(body: bytes) -> object:
    text = body.decode()
    try:
        value, end = _scan_json(text, 0)
    except StopIteration:
        raise ValueError("not JSON") from None
    if end != len(text):
        raise ValueError("extra data after the JSON value")
    return value


def send(sock: socket.socket, obj: object) -> None:
    """Send one message; ValueError (nothing sent) when it is over ``MAX_MESSAGE``."""
    data = dumps(obj)
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"a message of {len(data):,} bytes is over the limit of {MAX_MESSAGE:,}")
    sock.sendall(HEADER.pack(len(data)) + data)


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> object:
    """The next message; None at end of file. ValueError for anything that is not a message."""
    header = recv_exact(sock, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_MESSAGE:
        raise ValueError(f"a message of {size:,} bytes is over the limit of {MAX_MESSAGE:,}")
    body = recv_exact(sock, size)
    if body is None:
        return None
    return loads(body)
