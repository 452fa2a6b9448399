"""The Warning headers of the Kubernetes-style APIs: a translation warning quotes the
user's own text (an image, a name), which must neither make the header invalid (a
server refuses to send a control character and drops the connection) nor make it longer
than clients read (aiohttp: 8 KiB a line)."""

from __future__ import annotations

import re

import h11

from trainyard_common.events import FieldIssue
from trainyard_intake.dialect_api.k8s_resources import WARNINGS_MAX, warning_headers

HEADER = re.compile(r'299 - "(?:[ !#-\[\]-~]|\\[ -~])*"')  # printable, quotes escaped


def valid(header: str) -> bool:
    try:
        h11.Response(status_code=201, headers=[("Warning", header)])
    except h11.LocalProtocolError:
        return False
    return HEADER.fullmatch(header) is not None


def test_a_plain_warning_is_written_as_the_api_server_writes_it() -> None:
    issue = FieldIssue(path="$.spec", message='image "x" is not used')
    assert warning_headers([issue]) == ['299 - "$.spec: image \\"x\\" is not used"']


def test_control_characters_and_other_scripts_are_escaped() -> None:
    issue = FieldIssue(path="$.spec", message="image a\x1bb\x00c\r\td\ne\x7f 名 😀\\")
    [header] = warning_headers([issue])
    assert valid(header), header
    assert "a\\x1bb\\x00c\\x0d\\x09d e\\x7f \\u540d \\U0001f600\\\\" in header


def test_long_warnings_are_cut_and_past_the_total_left_out() -> None:
    one = FieldIssue(path="$.spec.image", message="名" * 70_000)
    [header] = warning_headers([one])
    assert valid(header) and len(header) <= WARNINGS_MAX + 12 and header.endswith('..."')
    many = [FieldIssue(path=f"$.x[{i}]", message="y" * 300) for i in range(100)]
    headers = warning_headers(many)
    assert all(valid(h) for h in headers)
    assert 10 <= len(headers) < 100 and sum(len(h) for h in headers) <= WARNINGS_MAX + 12 * 100
    # Cut never inside an escape: the closing quote is never escaped.
    for n in range(250, 262):
        assert all(valid(h) for h in warning_headers([FieldIssue(path="$", message="\\" * n)] * 20))
