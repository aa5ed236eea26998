"""Status bodies and validation, as the real API server words them.

Messages follow apimachinery ``pkg/api/errors/errors.go`` and the apiserver
filters (see shared/reference/kubernetes.md §10 for each row).
"""

from __future__ import annotations

import re
from typing import Any

CONFLICT_MSG = "the object has been modified; please apply your changes to the latest version and try again"
APF_BODY = "Too many requests, please try again later.\n"


class ApiStatus(Exception):
    """An error answer: HTTP code, Status body, extra headers."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details, self.headers = details, headers or {}

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        }
        if self.details:
            out["details"] = self.details
        return out


def qualified(group: str, plural: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(group: str, plural: str, name: str) -> ApiStatus:
    return ApiStatus(404, "NotFound", f'{qualified(group, plural)} "{name}" not found',
                     {"name": name, "group": group, "kind": plural})


def already_exists(group: str, plural: str, name: str) -> ApiStatus:
    return ApiStatus(409, "AlreadyExists", f'{qualified(group, plural)} "{name}" already exists',
                     {"name": name, "group": group, "kind": plural})


def conflict(group: str, plural: str, name: str) -> ApiStatus:
    return ApiStatus(409, "Conflict", f'Operation cannot be fulfilled on {qualified(group, plural)} "{name}": {CONFLICT_MSG}',
                     {"name": name, "group": group, "kind": plural})


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str]]) -> ApiStatus:
    text = ", ".join(f"{f}: {m}" for f, m in causes)
    return ApiStatus(422, "Invalid", f'{kind} "{name}" is invalid: {text}', {
        "name": name, "group": group, "kind": kind,
        "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in causes],
    })


def forbidden(group: str, plural: str, name: str, cause: str) -> ApiStatus:
    return ApiStatus(403, "Forbidden", f'{qualified(group, plural)} "{name}" is forbidden: {cause}',
                     {"name": name, "group": group, "kind": plural})


def rbac_denied(user: str, verb: str, group: str, plural: str, name: str, ns: str) -> ApiStatus:
    scope = f'in the namespace "{ns}"' if ns else "at the cluster scope"
    return forbidden(group, plural, name, f'User "{user}" cannot {verb} resource "{plural}" in API group "{group}" {scope}')


def unauthorized() -> ApiStatus:
    return ApiStatus(401, "Unauthorized", "Unauthorized")


def unsupported_media() -> ApiStatus:
    # The web layer's answer for a built-in resource (reference §11).
    return ApiStatus(415, "UnsupportedMediaType", "415: Unsupported Media Type")


def bad_request(message: str) -> ApiStatus:
    return ApiStatus(400, "BadRequest", message)


def expired(message: str) -> ApiStatus:
    return ApiStatus(410, "Expired", message)


# ---------------------------------------------------------------- validation

_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
_MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
_DNS1123 = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_QNAME = re.compile(rf"^({_DNS1123}(\.{_DNS1123})*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def check_time(value: Any, field: str, micro: bool = False) -> None:
    """metav1.Time (RFC 3339) / MicroTime (exactly six fractional digits): a decode error is 400."""
    if value is None:
        return
    pattern = _MICRO if micro else _TIME
    if not isinstance(value, str) or not pattern.match(value):
        layout = "2006-01-02T15:04:05.000000Z07:00" if micro else "2006-01-02T15:04:05Z07:00"
        raise bad_request(f'{field}: parsing time "{value}" as "{layout}": cannot parse')


def qualified_name(value: Any) -> bool:
    return isinstance(value, str) and bool(_QNAME.match(value)) and len(value) <= 316


def node_causes(node: dict[str, Any]) -> list[tuple[str, str]]:
    causes: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for i, t in enumerate((node.get("spec") or {}).get("taints") or []):
        where = f"spec.taints[{i}]"
        check_time(t.get("timeAdded"), f"{where}.timeAdded")
        if not qualified_name(t.get("key")):
            causes.append((f"{where}.key", f'Invalid value: "{t.get("key")}": name part must consist of alphanumeric characters'))
        if t.get("effect") not in EFFECTS:
            causes.append((f"{where}.effect", f'Unsupported value: "{t.get("effect")}": supported values: "NoExecute", "NoSchedule", "PreferNoSchedule"'))
        if not _LABEL_VALUE.match(str(t.get("value") or "")):
            causes.append((f"{where}.value", f'Invalid value: "{t.get("value")}"'))
        pair = (str(t.get("key")), str(t.get("effect")))
        if pair in seen:
            causes.append((f"{where}", f'Duplicate value: "{pair[0]}:{pair[1]}"'))
        seen.add(pair)
    for i, c in enumerate((node.get("status") or {}).get("conditions") or []):
        for f in ("lastHeartbeatTime", "lastTransitionTime"):
            check_time(c.get(f), f"status.conditions[{i}].{f}")
        if not c.get("type"):
            causes.append((f"status.conditions[{i}].type", "Required value"))
    return causes


def event_causes(ev: dict[str, Any], ns: str, new_api: bool) -> list[tuple[str, str]]:
    """events.k8s.io/v1 (new_api) or core/v1 Event validation, the parts the agent can get wrong."""
    causes: list[tuple[str, str]] = []
    check_time(ev.get("eventTime"), "eventTime", micro=True)
    check_time((ev.get("series") or {}).get("lastObservedTime"), "series.lastObservedTime", micro=True)
    obj = ev.get("regarding" if new_api else "involvedObject") or {}
    if new_api:
        for f in ("eventTime", "reportingController", "reportingInstance", "action", "reason"):
            if not ev.get(f):
                causes.append((f, "Required value"))
        for f in ("reportingInstance", "action", "reason"):
            if len(str(ev.get(f) or "")) > 128:
                causes.append((f, "Too long: may not be longer than 128"))
        if ev.get("reportingController") and not qualified_name(ev["reportingController"]):
            causes.append(("reportingController", "Invalid value: must be a qualified name"))
        if len(str(ev.get("note") or "").encode()) > 1024:
            causes.append(("note", "Too long: may not be longer than 1024"))
        series = ev.get("series")
        if series is not None and (int(series.get("count") or 0) < 2 or not series.get("lastObservedTime")):
            causes.append(("series", "Invalid value: count must be at least 2 with a lastObservedTime"))
    if ev.get("type") not in ("Normal", "Warning"):
        causes.append(("type", f'Unsupported value: "{ev.get("type")}"'))
    if not obj.get("namespace"):
        allowed = ("default", "kube-system") if ev.get("eventTime") else ("default", "")
        if ns not in allowed:
            field = "regarding.namespace" if new_api else "involvedObject.namespace"
            causes.append((field, 'Invalid value: "": does not match event.namespace'))
    return causes
