"""A fake kubelet PodResources server: real gRPC (grpcio) on a unix socket.

It serves ``/v1.PodResourcesLister/List`` (and answers ``GetAllocatableResources``
and ``Get`` with UNIMPLEMENTED, as an old kubelet would), encoding
``ListPodResourcesResponse`` by hand in the protobuf wire format of
``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``. Tests change the pods
while it runs (`set_pods`), make it fail (`fail`) or hang (`hang`).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

# A pod: (namespace, name, {container: [(resource, [device ids])]})
PodSpec = tuple[str, str, Mapping[str, Sequence[tuple[str, Sequence[str]]]]]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _str(number: int, s: str) -> bytes:
    return _field(number, s.encode())


def encode_list_response(pods: Iterable[PodSpec], cpu_ids: Sequence[int] = (3, 4)) -> bytes:
    """ListPodResourcesResponse; each container also gets cpu_ids (packed) and a
    memory block, which the client must skip as fields it does not read."""
    out = b""
    for namespace, name, containers in pods:
        pod = _str(1, name) + _str(2, namespace)
        for cname, devices in containers.items():
            c = _str(1, cname)
            for resource, ids in devices:
                d = _str(1, resource) + b"".join(_str(2, i) for i in ids)
                d += _field(3, _field(1, _varint(0x08) + _varint(0)))  # topology {nodes {ID: 0}}
                c += _field(2, d)
            c += _field(3, b"".join(_varint(i) for i in cpu_ids))
            c += _field(4, _str(1, "memory") + _varint(2 << 3) + _varint(1 << 30))
            pod += _field(3, c)
        out += _field(1, pod)
    return out


class FakeKubelet:
    """`with FakeKubelet(path) as k:` serves until the block ends."""

    def __init__(self, path: str, pods: Iterable[PodSpec] = ()) -> None:
        self.path = path
        self._pods: list[PodSpec] = list(pods)
        self._lock = threading.Lock()
        self._fail: tuple[Any, str] | None = None
        self._hang = threading.Event()  # set: List blocks until released
        self._release = threading.Event()
        self.calls = 0
        self.server: Any = None

    def set_pods(self, pods: Iterable[PodSpec]) -> None:
        with self._lock:
            self._pods = list(pods)

    def fail(self, code: str | None, message: str = "") -> None:
        """Answer List with this grpc.StatusCode name ("UNAVAILABLE", ...); None: answer normally."""
        import grpc

        with self._lock:
            self._fail = None if code is None else (getattr(grpc.StatusCode, code), message)

    def hang(self, on: bool = True) -> None:
        if on:
            self._release.clear()
            self._hang.set()
        else:
            self._hang.clear()
            self._release.set()

    def _list(self, request: bytes, context: Any) -> bytes:
        with self._lock:
            self.calls += 1
            pods, fail = list(self._pods), self._fail
        if self._hang.is_set():
            self._release.wait(60)
        if fail is not None:
            context.abort(fail[0], fail[1])
        return encode_list_response(pods)

    def start(self) -> FakeKubelet:
        from concurrent import futures

        import grpc

        if os.path.exists(self.path):
            os.unlink(self.path)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister", {"List": grpc.unary_unary_rpc_method_handler(self._list)}
        )
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port("unix:" + self.path)
        self.server.start()
        return self

    def stop(self) -> None:
        self.hang(False)
        if self.server is not None:
            self.server.stop(0).wait(5)
            self.server = None

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------ a hostile kubelet (issue 25 item 4)


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


SETTINGS, HEADERS, CONTINUATION, DATA = 4, 1, 9, 0
END_STREAM, END_HEADERS = 0x1, 0x4


def hostile(path: str, script: Callable[[socket.socket], None]) -> threading.Thread:
    """A unix socket that accepts one connection, reads the request, and plays `script` to the client."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        try:
            conn.settimeout(5)
            conn.recv(1 << 16)
            conn.sendall(frame(SETTINGS, 0, 0, b""))
            script(conn)
        except OSError:
            pass  # the client gave up, as it should
        finally:
            conn.close()
            srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def non_utf8_headers(conn: socket.socket) -> None:
    import hpack

    block = hpack.Encoder().encode([(b":status", b"200"), (b"content-type", b"application/grpc"),
                                    (b"grpc-status", b"\xff\xfe"), (b"grpc-message", b"\xc3\x28\x1b[2J" * 100)])
    conn.sendall(frame(HEADERS, END_HEADERS | END_STREAM, 1, block))
    time.sleep(1)


def continuation_flood(conn: socket.socket) -> None:
    import hpack

    conn.sendall(frame(HEADERS, 0, 1, hpack.Encoder().encode([(b":status", b"200")])))
    junk = frame(CONTINUATION, 0, 1, b"\x00" * 16000)
    for _ in range(4000):  # 64 MB if nobody stops it
        conn.sendall(junk)


def protocol_error(conn: socket.socket) -> None:
    conn.sendall(frame(DATA, END_STREAM, 0, b"x"))  # DATA on stream 0: a connection error
    time.sleep(1)


def http1_answer(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    time.sleep(1)
