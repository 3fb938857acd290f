"""Codes, responses and what handlers' results become (no network)."""

from __future__ import annotations

import pytest

from cobalt import Code, ContentFormat, Option, Response
from cobalt._message import answer_of


def test_codes_print_and_parse_as_dotted_text():
    assert str(Code.NOT_FOUND) == "4.04" and Code("4.04") == Code.NOT_FOUND == 0x84
    assert Code(2, 5) == Code.CONTENT and Code.CONTENT.name == "Content"
    assert Code.GATEWAY_TIMEOUT.is_error() and not Code.CHANGED.is_error()
    assert repr(Code(2, 31)) == "<Code 2.31 Continue>"
    with pytest.raises(ValueError):
        Code("2.5x")
    with pytest.raises(ValueError):
        Code(8, 0)


def test_a_response_builds_its_options():
    r = Response(Code.CREATED, "x", content_format=ContentFormat.JSON, max_age=0, location="/rd/4", etag=b"\x01")
    assert (r.content_format, r.max_age, r.location, r.etag, r.text) == (50, 0, "/rd/4", b"\x01", "x")
    assert r.option_values(Option.LOCATION_PATH) == [b"rd", b"4"]
    assert r.option(Option.MAX_AGE) == b""  # 0 is the empty integer


def test_handler_results_become_responses():
    get, post, delete = int(Code.GET), int(Code.POST), int(Code.DELETE)
    r = answer_of("hi", get)
    assert (r.code, r.payload, r.content_format) == (Code.CONTENT, b"hi", ContentFormat.TEXT)
    r = answer_of(b"\x00", post)
    assert (r.code, r.payload, r.content_format) == (Code.CHANGED, b"\x00", None)
    r = answer_of({"a": [1]}, get)
    assert (r.payload, r.content_format) == (b'{"a": [1]}', ContentFormat.JSON)
    assert answer_of(None, delete).code == Code.DELETED
    assert answer_of(Code.VALID, get).code == Code.VALID
    r = answer_of((Code.CREATED, "made"), post)
    assert (r.code, r.text) == (Code.CREATED, "made")
    r = answer_of(("4.00", None), post)
    assert (r.code, r.payload) == (Code.BAD_REQUEST, b"")
    with pytest.raises(TypeError, match="not float"):
        answer_of(1.5, get)
