"""The three PATCH flavours of the API server, for the fields the agent touches.

- JSON Patch (RFC 6902): a failing ``test`` op or a missing path → 422
  (apiserver handlers/patch.go answers a failed apply with
  StatusUnprocessableEntity); a body that is not an array → 400.
- JSON merge patch (RFC 7386): maps merged, arrays replaced, null deletes.
- Strategic merge patch: like merge patch, except lists that carry a
  ``patchMergeKey`` in the Go types (``status.conditions`` by ``type``,
  ``metadata.ownerReferences`` by ``uid``, ``status.addresses`` by ``type``)
  merge item by item and honour ``$patch: delete``; every other list —
  ``spec.taints`` is ``+listType=atomic`` with no merge key — is replaced
  whole (apimachinery strategicpatch ``mergeSliceHandler``).
"""

from __future__ import annotations

import copy
from typing import Any

MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
    ("metadata", "ownerReferences"): "uid",
}


class PatchError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


# ---------------------------------------------------------------- merge patch


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# ---------------------------------------------------------------- strategic merge


def strategic_merge(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    if not isinstance(patch, dict):
        return _strip(copy.deepcopy(patch))
    if patch.get("$patch") == "replace":
        return _strip({k: v for k, v in patch.items() if k != "$patch"})
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$setElementOrder/") or k in ("$retainKeys", "$patch"):
            continue  # ordering hints and directives handled elsewhere
        sub = path + (k,)
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and sub in MERGE_KEYS:
            out[k] = _merge_list(out.get(k) or [], v, MERGE_KEYS[sub], sub)
        elif isinstance(v, dict):
            out[k] = strategic_merge(out.get(k), v, sub)
        else:
            out[k] = _strip(copy.deepcopy(v))
    return out


def _merge_list(current: list[Any], items: list[Any], key: str, path: tuple[str, ...]) -> list[Any]:
    out = [copy.deepcopy(x) for x in current]
    for item in items:
        if not isinstance(item, dict) or key not in item:
            raise PatchError(400, f"map: {item!r} does not contain declared merge key: {key}")
        directive = item.get("$patch")
        idx = next((i for i, x in enumerate(out) if isinstance(x, dict) and x.get(key) == item[key]), None)
        if directive == "delete":
            if idx is not None:
                del out[idx]
        elif directive == "replace":
            return [_strip({k: v for k, v in item.items() if k != "$patch"})]
        elif idx is None:
            out.append(_strip(copy.deepcopy(item)))
        else:
            out[idx] = strategic_merge(out[idx], item, path)
    return out


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


# ---------------------------------------------------------------- JSON patch


def json_patch(doc: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise PatchError(400, "error decoding patch: json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    if len(ops) > 10000:
        raise PatchError(422, "The allowed maximum operations in a JSON patch is 10000, got more")
    out = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(400, "error decoding patch: missing op or path")
        out = _apply_op(out, op)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(422, f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    cur = doc
    for p in parts[:-1]:
        cur = _child(cur, p)
    return cur, parts[-1]


def _child(cur: Any, p: str) -> Any:
    try:
        return cur[int(p)] if isinstance(cur, list) else cur[p]
    except (KeyError, IndexError, ValueError, TypeError):
        raise PatchError(422, f"the server rejected our request due to an error in our request: missing path {p!r}") from None


def _get(doc: Any, path: str) -> Any:
    cur = doc
    for p in _pointer(path):
        cur = _child(cur, p)
    return cur


def _apply_op(doc: Any, op: dict[str, Any]) -> Any:
    kind, parts = op["op"], _pointer(op["path"])
    if kind == "test":
        if _get(doc, op["path"]) != op.get("value"):
            raise PatchError(422, "the server rejected our request due to an error in our request")
        return doc
    if kind in ("move", "copy"):
        value = copy.deepcopy(_get(doc, op["from"]))
        if kind == "move":
            doc = _apply_op(doc, {"op": "remove", "path": op["from"]})
        return _apply_op(doc, {"op": "add", "path": op["path"], "value": value})
    if not parts:
        return copy.deepcopy(op.get("value")) if kind in ("add", "replace") else None
    parent, last = _parent(doc, parts)
    if kind == "add":
        if isinstance(parent, list):
            idx = len(parent) if last == "-" else int(last)
            if not 0 <= idx <= len(parent):
                raise PatchError(422, f"add: index {idx} out of range")
            parent.insert(idx, copy.deepcopy(op.get("value")))
        elif isinstance(parent, dict):
            parent[last] = copy.deepcopy(op.get("value"))
        else:
            raise PatchError(422, f"add: {op['path']} has no parent object")
    elif kind in ("remove", "replace"):
        _child(parent, last)  # must exist
        if kind == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            parent[int(last) if isinstance(parent, list) else last] = copy.deepcopy(op.get("value"))
    else:
        raise PatchError(422, f"unknown JSON patch op {kind!r}")
    return doc
