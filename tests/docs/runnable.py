"""The command blocks a docs page marks as runnable, read the way a reader copies them.

A page marks a fenced ``bash`` block with an HTML comment on the line before it (invisible on the site):

- ``<!-- docs-test: background -->``: a server the reader leaves running (``progrouter engine``, ``serve``);
- ``<!-- docs-test: run expect="TEXT" -->``: a command that must exit 0 and print ``TEXT``.

The ports the page uses are replaced by free ones, so the blocks run beside anything else on the machine.
"""

from __future__ import annotations

import re
import shlex
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"

_MARKER = re.compile(
    r"^<!-- docs-test: (?P<kind>background|run)(?: expect=\"(?P<expect>[^\"]*)\")? -->\n"
    r"```(?P<lang>\w*)\n(?P<body>.*?)\n```",
    re.M | re.S,
)
_ANY_MARKER = re.compile(r"<!-- docs-test:")
_PORT = re.compile(r"(?<=127\.0\.0\.1:)(\d+)|(?<=--port )(\d+)")


@dataclass(frozen=True)
class Block:
    """One marked block: what kind, what it must print, its shell text and where it is."""

    kind: str
    expect: str | None
    lang: str
    body: str
    line: int


def blocks(page: Path) -> list[Block]:
    """Every marked block of ``page`` in order; a marker not followed by a fence is an error."""
    text = page.read_text()
    found = [
        Block(m["kind"], m["expect"], m["lang"], m["body"], text.count("\n", 0, m.start()) + 1)
        for m in _MARKER.finditer(text)
    ]
    if len(found) != len(_ANY_MARKER.findall(text)):
        raise ValueError(f"{page}: a docs-test marker is not directly followed by a fenced block")
    return found


def marked_pages() -> list[Path]:
    """The pages under docs/ that mark at least one block."""
    return sorted(p for p in DOCS.rglob("*.md") if _ANY_MARKER.search(p.read_text()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def ports_of(blocks_: list[Block]) -> list[int]:
    """The ports the blocks name (``127.0.0.1:N`` or ``--port N``), in order of first use."""
    seen: dict[int, None] = {}
    for block in blocks_:
        for m in _PORT.finditer(block.body):
            seen[int(m[1] or m[2])] = None
    return list(seen)


def runnable(body: str, ports: dict[int, int]) -> str:
    """The block as this test runs it: its ports replaced, ``progrouter`` as this interpreter's module."""

    def port(m: re.Match[str]) -> str:
        return str(ports[int(m[0])])

    text = _PORT.sub(port, body)
    module = f"{shlex.quote(sys.executable)} -m progrouter"
    return re.sub(r"(?m)^progrouter(?= )", module, text)
