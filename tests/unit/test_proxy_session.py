"""Which session a request through the router belongs to: the header first, else the OpenAI ``user`` field."""

import json

from megatron_rl.inference.proxy import session_key


def body(**fields) -> bytes:
    return json.dumps({"model": "m", "messages": [], **fields}).encode()


def test_header_wins_over_the_user_field():
    assert session_key({"X-Session-Id": "s1"}, body(user="alice")) == "s1"


def test_user_field_names_the_session():
    assert session_key({}, body(user="alice")) == "alice"
    assert session_key({}, body(user=7)) == "7"


def test_no_session_without_header_or_user():
    assert session_key({}, body()) is None
    assert session_key({}, body(user="")) is None
    assert session_key({}, b'{"user": ') is None  # malformed: vLLM answers it with 400; the router does not guess
    assert session_key({}, b'["user"]') is None
