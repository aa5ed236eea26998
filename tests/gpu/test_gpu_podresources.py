"""The PodResources client against a fake kubelet speaking real gRPC (grpcio) on a
unix socket: the reply decoded, errors, a hang, no socket; the wire format alone."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fakekubelet import FakeKubelet, continuation_flood, encode_list_response, hostile, http1_answer, non_utf8_headers, protocol_error
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.gpu import podresources as pr

PODS = [
    ("ml", "train-0", {"main": [("nvidia.com/gpu", ["GPU-a", "GPU-b"]), ("example.com/nic", ["nic0"])], "sidecar": []}),
    ("ml", "infer-1", {"srv": [("nvidia.com/mig-1g.10gb", ["MIG-4d1f"])]}),
]


@pytest.fixture
def sock(tmp_path) -> str:
    return str(tmp_path / "kubelet.sock")


def test_list_returns_every_pod_container_and_device(sock: str) -> None:
    with FakeKubelet(sock, PODS):
        pods = pr.list_pods(sock)
    assert pods == [
        pr.Pod("ml", "train-0", (
            pr.Container("main", (pr.Devices("nvidia.com/gpu", ("GPU-a", "GPU-b")), pr.Devices("example.com/nic", ("nic0",)))),
            pr.Container("sidecar", ()),
        )),
        pr.Pod("ml", "infer-1", (pr.Container("srv", (pr.Devices("nvidia.com/mig-1g.10gb", ("MIG-4d1f",)),)),)),
    ]


def test_a_reply_larger_than_one_http2_window_is_read_whole(sock: str) -> None:
    many = [("batch", f"job-{i:04d}-{'x' * 40}", {"c": [("nvidia.com/gpu", [f"GPU-{i:08x}-1111-2222-3333-444455556666"])]}) for i in range(2000)]
    assert len(encode_list_response(many)) > 65535 * 2
    with FakeKubelet(sock, many):
        pods = pr.list_pods(sock)
    assert [p.name for p in pods] == [p[1] for p in many]


def test_no_pods(sock: str) -> None:
    with FakeKubelet(sock, []):
        assert pr.list_pods(sock) == []


def test_a_grpc_error_status_is_an_error_naming_it(sock: str) -> None:
    with FakeKubelet(sock, PODS) as kubelet:
        kubelet.fail("UNAVAILABLE", "kubelet is shutting down")
        with pytest.raises(pr.PodResourcesError, match="grpc-status 14: kubelet is shutting down"):
            pr.list_pods(sock)
        kubelet.fail(None)
        assert len(pr.list_pods(sock)) == 2


def test_a_kubelet_that_never_answers_is_an_error_after_the_timeout(sock: str) -> None:
    with FakeKubelet(sock, PODS) as kubelet:
        kubelet.hang()
        with pytest.raises(pr.PodResourcesError, match="did not answer in time"):
            pr.list_pods(sock, timeout=0.5)
        assert kubelet.calls == 1


def test_a_listener_that_accepts_and_says_nothing_is_an_error(tmp_path) -> None:
    import socket

    path = str(tmp_path / "mute.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen()
    held = []
    t = threading.Thread(target=lambda: held.append(srv.accept()), daemon=True)
    t.start()
    try:
        with pytest.raises(pr.PodResourcesError, match="did not answer in time"):
            pr.list_pods(path, timeout=0.5)
    finally:
        srv.close()


def test_no_socket(tmp_path) -> None:
    with pytest.raises(pr.PodResourcesError, match="cannot connect"):
        pr.list_pods(str(tmp_path / "absent.sock"))


def test_unknown_fields_are_skipped_and_garbage_is_an_error() -> None:
    body = encode_list_response(PODS[:1])
    extra = bytes([0x10 | 0, 7]) + bytes([0x1D]) + b"\x01\x02\x03\x04"  # field 2 varint, field 3 fixed32
    assert pr.decode_list_response(body + extra)[0].name == "train-0"
    with pytest.raises(pr.PodResourcesError, match="malformed"):
        pr.decode_list_response(b"\x0a\x40abc")
    with pytest.raises(pr.PodResourcesError, match="malformed"):
        pr.decode_list_response(b"\x0b")  # wire type 3 (groups) is not in proto3
    with pytest.raises(pr.PodResourcesError, match="truncated"):
        pr.grpc_messages(b"\x00\x00\x00\x00\x09abc")


# ------------------------------------------------------------------ a hostile kubelet (issue 25 item 4)


@pytest.mark.parametrize("script", [non_utf8_headers, continuation_flood, protocol_error, http1_answer],
                         ids=lambda f: f.__name__)
def test_a_hostile_kubelet_is_a_bounded_error_naming_the_socket(sock: str, script: Any) -> None:
    """Non-UTF-8 headers, a CONTINUATION flood, an h2 ProtocolError, HTTP/1: each a PodResourcesError naming the
    socket (so attribution reaches its fallback: the whole node), never UnicodeDecodeError or ProtocolError."""
    t = hostile(sock, script)
    with pytest.raises(pr.PodResourcesError) as err:
        pr.list_pods(sock, timeout=10)
    said = str(err.value)
    assert sock in said and len(said) < 600 and "\x1b" not in said and "\n" not in said, said
    t.join(15)


@given(st.binary(max_size=400))
@settings(max_examples=300, deadline=None)
def test_any_bytes_decode_to_pods_or_a_podresources_error(data: bytes) -> None:
    """The decoders of what the kubelet sends: pods, or PodResourcesError; never another exception."""
    for decode in (pr.decode_list_response, pr.grpc_messages):
        try:
            decode(data)
        except pr.PodResourcesError:
            pass
