"""What the RIPE Atlas API sends, read as it arrives: a page of results (one JSON array of
objects that JSON lines can carry, yielded one result at a time, so memory does not grow with
the page) and a metadata answer (one JSON object: a measurement, a page of probes)."""

from __future__ import annotations

import json
import re
from typing import Iterable, Iterator


class PageError(ValueError):
    """A page that is not what the API sends (not a JSON array of results JSON lines can carry,
    not a JSON object): what is wrong, without the window (the caller names it)."""


_NOT_SPACE = re.compile(r"[^ \t\n\r]")


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")


class _Text:
    """A JSON text arriving in pieces, read one value at a time: it holds the value being read
    and what arrived after it, whatever the page's size."""

    def __init__(self, pieces: Iterable[str]):
        self.pieces, self.buf, self.pos, self.dropped, self.eof = iter(pieces), "", 0, 0, False
        self.decoder = json.JSONDecoder(parse_constant=_not_json)

    def _more(self) -> bool:
        """Reads on until the unread text has doubled (a value cut between pieces is decoded
        again from its start, so doubling keeps that linear in its size); False at the end."""
        if self.eof:
            return False
        got, n, need = [], 0, max(len(self.buf) - self.pos, 1)
        for piece in self.pieces:
            got.append(piece)
            n += len(piece)
            if n >= need:
                break
        else:
            self.eof = True
        if not n:
            return False
        self.dropped += self.pos
        self.buf, self.pos = self.buf[self.pos:] + "".join(got), 0
        return True

    def peek(self) -> str:
        """The next character that is not white space, left unread ("" at the end)."""
        while True:
            m = _NOT_SPACE.search(self.buf, self.pos)
            if m:
                self.pos = m.start()
                return self.buf[self.pos]
            self.pos = len(self.buf)
            if not self._more():
                return ""

    def value(self, what: str):
        self.peek()
        while True:
            try:
                v, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if self._more():
                    continue
                raise PageError(f"{what} is not JSON ({e.msg} at character {self.dropped + e.pos:,})") from None
            except RecursionError:
                raise PageError(f"{what} is nested too deep") from None
            except ValueError as e:  # NaN or Infinity; an integer of more digits than Python converts
                raise PageError(f"{what}: {e}") from None
            if end == len(self.buf) and self._more():  # a number may go on in the next piece
                continue
            self.pos = end
            return v


def _opening(first: str, want: str) -> str:
    return {"": "an empty answer", "{": "a JSON object", "[": "a JSON array"}.get(first, f"not {want}")


def page_lines(pieces: Iterable[str]) -> Iterator[bytes]:
    """The JSON lines of a page of results, one per result as it is read: the page's text,
    arriving in `pieces`, must be one JSON array of objects, each one that JSON lines can carry
    (orjson: integers within 64 bits, at most 254 levels of nesting, valid UTF-8). Raises
    PageError at the first thing that is not, having yielded the results before it."""
    import orjson

    text = _Text(pieces)
    first = text.peek()
    if first != "[":
        raise PageError(f"{_opening(first, 'a JSON array')}, not a list of results (is --api the RIPE Atlas API?)")
    text.pos += 1
    n = 0
    if text.peek() == "]":
        text.pos += 1
    else:
        while True:
            n += 1
            result = text.value(f"result {n}")
            if not isinstance(result, dict):
                raise PageError(f"result {n} is {json_kind(result)}, not an object")
            try:
                line = orjson.dumps(result)
            except orjson.JSONEncodeError as e:
                raise PageError(f"result {n} holds what RIPE Atlas never sends ({e})") from None
            yield line + b"\n"
            after = text.peek()
            text.pos += 1
            if after == "]":
                break
            if after != ",":
                raise PageError(f"not JSON: {repr(after) if after else 'the end of the page'} after result {n}, "
                                "not ',' or ']'")
    if text.peek():
        raise PageError("more text after the list of results")


def one_object(pieces: Iterable[str], what: str) -> dict:
    """The one JSON object a metadata answer is (a measurement, a page of probes)."""
    text = _Text(pieces)
    first = text.peek()
    if first != "{":
        raise PageError(f"{_opening(first, 'a JSON object')}, not {what} (is --api the RIPE Atlas API?)")
    value = text.value(what)
    if text.peek():
        raise PageError(f"more text after {what}")
    return value


def json_kind(v) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)
