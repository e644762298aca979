"""Checks on a decoded request body that JSON itself allows but the gateway cannot carry:
nesting deeper than a limit (the stdlib decoder recurses; orjson and engines refuse past
their own depths) and lone surrogates (`"\\ud800"`, or the UTF-8 bytes of one, which Python's
decoder lets through): no UTF-8 encoder, hash or log line can take them.

Both checks start with a scan of the raw bytes in C, so a body that cannot hold the problem
(fewer brackets than the depth limit, no surrogate escape) costs no walk over the value.
"""

from __future__ import annotations

import re
from typing import Any

from gateway.errors import bad_request

_SURROGATE_BYTES = re.compile(rb"\\[uU][dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_shape(raw: bytes, body: Any, max_depth: int) -> None:
    """Raise a 400 naming the field when `body` nests too deep or holds a lone surrogate."""
    if raw.count(b"[") + raw.count(b"{") > max_depth and depth_exceeds(body, max_depth):
        raise bad_request(
            f"The request body nests deeper than {max_depth} levels.", code="json_too_deep"
        )
    if _SURROGATE_BYTES.search(raw):
        where = surrogate_path(body)
        if where is not None:
            raise bad_request(
                f"`{where or 'body'}` holds a lone surrogate (not a Unicode character).",
                param=where or None,
                code="invalid_unicode",
            )


def depth_exceeds(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > limit:
            return True
        children = v.values() if isinstance(v, dict) else v
        stack.extend((c, d + 1) for c in children if isinstance(c, dict | list))
    return False


def surrogate_path(value: Any, path: str = "") -> str | None:
    """The path (`messages[0].content`) of the first string holding a lone surrogate."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return p
        elif isinstance(v, dict):
            for k, c in v.items():
                key_path = f"{p}.{k}" if p else str(k)
                if _SURROGATE.search(k):
                    return key_path.encode("utf-8", "backslashreplace").decode()
                stack.append((c, key_path))
        elif isinstance(v, list):
            stack.extend((c, f"{p}[{i}]") for i, c in enumerate(v))
    return None
