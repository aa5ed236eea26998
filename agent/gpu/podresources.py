"""The kubelet PodResources API, v1 ``List``, over its unix socket.

``/var/lib/kubelet/pod-resources/kubelet.sock`` serves gRPC
(``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``, service
``v1.PodResourcesLister``): the devices each container of each pod on the node
was allocated by a device plugin, with ids as the plugin names them (the
NVIDIA plugin: ``GPU-<uuid>``, ``MIG-<uuid>``, ``GPU-<uuid>::<n>`` for a
time-sliced replica, or indexes; GKE: ``nvidia0``, ``nvidia0/gi1``). It is the
interface dcgm-exporter uses to label GPU series with pods.

The client is small on purpose (benches/README.md, "PodResources client"): one
unary call a poll, its few messages decoded here by hand (protobuf wire format),
HTTP/2 framed by the pure-Python ``h2`` (imported only when the call is made).
grpcio would cost far more memory and start-up for the same call. The reply is
read in full under one deadline: a kubelet that accepts and never answers is
an error after `timeout`, never a hung poll.

The kubelet is a peer, and what it sends is bounded and fails alone: every
byte read counts against ``MAX_READ`` (header blocks included, so a flood of
CONTINUATION frames ends the call), headers are decoded leniently, and any
exception of ``h2``, of the decoder or of the socket becomes a
`PodResourcesError` naming the socket, so the caller reaches its fallback
(cannot tell who holds a GPU: the whole node) rather than failing the check.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
METHOD = "/v1.PodResourcesLister/List"
MAX_REPLY = 16 << 20  # kubelet's own limit is 16 MiB (podresources.DefaultMaxMsgSize)
MAX_READ = MAX_REPLY + (1 << 20)  # bytes read from the socket in all: the reply and its framing, headers included
MAX_HEADER = 1024  # characters of a header value kept (grpc-message is quoted from it)


class PodResourcesError(Exception):
    """The List call failed (no socket, refused, timed out, a gRPC error status)."""


@dataclass(frozen=True, slots=True)
class Devices:
    resource: str  # "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", ...
    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Container:
    name: str
    devices: tuple[Devices, ...]


@dataclass(frozen=True, slots=True)
class Pod:
    namespace: str
    name: str
    containers: tuple[Container, ...]


# ------------------------------------------------------------------ protobuf wire format


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise PodResourcesError("malformed protobuf: varint runs past the message")
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return value, i
        shift += 7


def fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field: ints for varints and fixed, bytes for
    length-delimited. Unknown fields are skipped by the callers, as protobuf does."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            yield number, value
        elif wire == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise PodResourcesError("malformed protobuf: field runs past the message")
            yield number, buf[i : i + n]
            i += n
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if i + size > len(buf):
                raise PodResourcesError("malformed protobuf: field runs past the message")
            yield number, int.from_bytes(buf[i : i + size], "little")
            i += size
        else:
            raise PodResourcesError(f"malformed protobuf: wire type {wire}")


def _text(v: int | bytes) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else ""


def _devices(buf: bytes) -> Devices:
    # ContainerDevices: resource_name = 1, device_ids = 2, topology = 3
    resource, ids = "", []
    for n, v in fields(buf):
        if n == 1:
            resource = _text(v)
        elif n == 2:
            ids.append(_text(v))
    return Devices(resource, tuple(ids))


def _container(buf: bytes) -> Container:
    # ContainerResources: name = 1, devices = 2, cpu_ids = 3, memory = 4, dynamic_resources = 5
    name, devices = "", []
    for n, v in fields(buf):
        if n == 1:
            name = _text(v)
        elif n == 2 and isinstance(v, bytes):
            devices.append(_devices(v))
    return Container(name, tuple(devices))


def _pod(buf: bytes) -> Pod:
    # PodResources: name = 1, namespace = 2, containers = 3
    name = namespace = ""
    containers = []
    for n, v in fields(buf):
        if n == 1:
            name = _text(v)
        elif n == 2:
            namespace = _text(v)
        elif n == 3 and isinstance(v, bytes):
            containers.append(_container(v))
    return Pod(namespace, name, tuple(containers))


def decode_list_response(buf: bytes) -> list[Pod]:
    """ListPodResourcesResponse: pod_resources = 1 (repeated PodResources)."""
    return [_pod(v) for n, v in fields(buf) if n == 1 and isinstance(v, bytes)]


def grpc_messages(body: bytes) -> list[bytes]:
    """The messages of a gRPC body: each a 1-byte compressed flag, a 4-byte length, the bytes."""
    out, i = [], 0
    while i < len(body):
        if i + 5 > len(body):
            raise PodResourcesError("truncated gRPC message")
        flag, n = body[i], struct.unpack(">I", body[i + 1 : i + 5])[0]
        if flag:
            raise PodResourcesError("compressed gRPC message (no compression was offered)")
        if i + 5 + n > len(body):
            raise PodResourcesError("truncated gRPC message")
        out.append(body[i + 5 : i + 5 + n])
        i += 5 + n
    return out


# ------------------------------------------------------------------ the call


def list_pods(path: str, timeout: float = 5.0) -> list[Pod]:
    """One v1 List call on the unix socket `path`; raises PodResourcesError (naming `path`), whatever the peer
    sends or does."""
    try:
        return _list_pods(path, timeout)
    except PodResourcesError as exc:
        if path in str(exc):
            raise
        raise PodResourcesError(f"List on {path}: {exc}") from None
    except Exception as exc:  # h2's ProtocolError, a decoder's error, anything a broken or hostile peer causes
        raise PodResourcesError(f"List on {path}: {type(exc).__name__}: {_bounded(str(exc))}") from None


def _bounded(text: str, limit: int = 200) -> str:
    """A peer's text as an error quotes it: escaped (no control or non-ASCII characters) and cut."""
    shown = json.dumps(text[:limit], ensure_ascii=True)[1:-1]
    cut = len(text) > limit
    if len(shown) > limit:  # escapes take room: cut, never inside an escape
        cut, shown = True, shown[:limit]
        tail = shown.rfind("\\")
        shown = shown[:tail] if tail >= limit - 6 else shown
    return shown + "..." if cut else shown


def _list_pods(path: str, timeout: float) -> list[Pod]:
    deadline = time.monotonic() + timeout
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:  # pragma: no cover - out of descriptors
        raise PodResourcesError(f"socket: {exc}") from None
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            raise PodResourcesError(f"cannot connect to {path}: {exc.strerror or exc}") from None
        headers, body, trailers = _unary(sock, b"", deadline)
    finally:
        sock.close()
    status = trailers.get("grpc-status", headers.get("grpc-status", ""))
    if status != "0":
        message = _bounded(trailers.get("grpc-message", headers.get("grpc-message", "")))
        what = (f"grpc-status {_bounded(status, 16)}" if status
                else f"no grpc-status (HTTP status {_bounded(headers.get(':status', '?'), 16)})")
        raise PodResourcesError(f"List on {path}: {what}{': ' + message if message else ''}")
    messages = grpc_messages(body)
    if len(messages) != 1:
        raise PodResourcesError(f"List on {path}: {len(messages)} messages in a unary reply")
    return decode_list_response(messages[0])


def _unary(sock: socket.socket, request: bytes, deadline: float) -> tuple[dict[str, str], bytes, dict[str, str]]:
    """Sends one gRPC request on a fresh HTTP/2 connection; returns the reply's
    headers, body and trailers."""
    import h2.config
    import h2.connection
    import h2.events

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    stream = conn.get_next_available_stream_id()
    conn.send_headers(
        stream,
        [
            (":method", "POST"), (":scheme", "http"), (":path", METHOD), (":authority", "localhost"),
            ("content-type", "application/grpc"), ("te", "trailers"), ("user-agent", "node-health-agent"),
        ],
    )
    conn.send_data(stream, b"\x00" + struct.pack(">I", len(request)) + request, end_stream=True)
    headers: dict[str, str] = {}
    trailers: dict[str, str] = {}
    body = bytearray()
    done = False
    read = 0
    while not done:
        _send(sock, conn.data_to_send(), deadline)
        data = _recv(sock, deadline)
        if not data:
            raise PodResourcesError("the kubelet closed the connection before the reply ended")
        read += len(data)
        if read > MAX_READ:
            raise PodResourcesError(f"the kubelet sent more than {MAX_READ} bytes (headers and framing included)")
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                headers = _headers(event.headers)
            elif isinstance(event, h2.events.TrailersReceived):
                trailers = _headers(event.headers)
            elif isinstance(event, h2.events.DataReceived):
                body += event.data
                if len(body) > MAX_REPLY:
                    raise PodResourcesError(f"reply larger than {MAX_REPLY} bytes")
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                raise PodResourcesError(f"the kubelet reset the stream (HTTP/2 error {event.error_code})")
            elif isinstance(event, h2.events.ConnectionTerminated):
                raise PodResourcesError(f"the kubelet ended the connection (HTTP/2 error {event.error_code})")
            elif isinstance(event, h2.events.StreamEnded):
                done = True
    return headers, bytes(body), trailers


def _headers(pairs: object) -> dict[str, str]:
    """Header names and values as text, whatever bytes the peer sent (non-UTF-8 replaced), each bounded."""
    out = {}
    for k, v in pairs:  # type: ignore[attr-defined]
        key = k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)
        value = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
        out[key[:MAX_HEADER]] = value[:MAX_HEADER]
    return out


def _send(sock: socket.socket, data: bytes, deadline: float) -> None:
    if data:
        sock.settimeout(_left(deadline))
        try:
            sock.sendall(data)
        except OSError as exc:
            raise PodResourcesError(f"send: {exc}") from None


def _recv(sock: socket.socket, deadline: float) -> bytes:
    sock.settimeout(_left(deadline))
    try:
        return sock.recv(1 << 16)
    except TimeoutError:
        raise PodResourcesError("the kubelet did not answer in time") from None
    except OSError as exc:
        raise PodResourcesError(f"recv: {exc}") from None


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise PodResourcesError("the kubelet did not answer in time")
    return left
