"""The bounded JSON parser's checks, found on the text without a step of Python per
character: nesting against a plain scan of every character (the form it had), and lone
surrogates looked for only where a \\u escape could make one."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard_common.parsing import BodyError, json_depth, parse_json, parse_yaml


def scanned_depth(text: str, max_depth: int) -> int | None:
    """Where a scan of every character finds the nesting too deep (None: it does not)."""
    depth, in_string, escaped = 0, False, False
    for position, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                return position
        elif char in "]}":
            depth -= 1
    return None


def refused_at(text: str, max_depth: int) -> int | None:
    try:
        json_depth(text, max_depth)
    except BodyError as exc:
        return int(str(exc).rsplit("character ", 1)[1].rstrip(")"))
    return None


# Texts of what matters to the scan (quotes, escapes, brackets, newlines) and filler.
TEXTS = st.text(alphabet=st.sampled_from('"\\[]{}\n ax:,'), max_size=200)


@settings(max_examples=3000, deadline=None)
@given(TEXTS, st.integers(min_value=0, max_value=6))
def test_nesting_is_refused_where_a_scan_of_every_character_refuses_it(
    text: str, max_depth: int
) -> None:
    assert refused_at(text, max_depth) == scanned_depth(text, max_depth)


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(), inner, max_size=4), max_leaves=30),
       st.integers(min_value=1, max_value=8))  # fmt: skip
def test_real_json_is_refused_exactly_when_nested_too_deep(value: object, max_depth: int) -> None:
    text = json.dumps(value)
    assert refused_at(text, max_depth) == scanned_depth(text, max_depth)


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "\\ud800"}',  # a lone high surrogate
        '{"\\uDC00": 1}',  # a lone low one, as a key
        '["ok", {"deep": ["\\udbff"]}]',
    ],
)
def test_a_lone_surrogate_escape_is_refused(text: str) -> None:
    with pytest.raises(BodyError, match="lone surrogate"):
        parse_json(text)


def test_a_surrogate_pair_and_an_escaped_backslash_are_accepted() -> None:
    assert parse_json('{"smile": "\\ud83d\\ude00"}') == {"smile": "\U0001f600"}
    assert parse_json('{"path": "C:\\\\ud800"}') == {"path": "C:\\ud800"}


def test_numbers_out_of_range_are_still_refused() -> None:
    for text in ('{"a": 1e999}', '{"a": NaN}', '{"a": -Infinity}', '{"a": ' + "9" * 5000 + "}"):
        with pytest.raises(BodyError):
            parse_json(text)
    # YAML's integers int() refuses (more than 4300 digits) in each of their forms: a
    # 400, not the ValueError that was a 500.
    for number in ("9" * 5000, "0x" + "f" * 5000, "1_" + "9" * 5000, "0b" + "1" * 20000):
        with pytest.raises(BodyError, match="out of range"):
            parse_yaml(f"replicas: {number}\n")
        with pytest.raises(BodyError):
            parse_yaml(f"{{{number}: x}}\n")
    assert parse_yaml("a: 0x" + "f" * 3000 + "\n")["a"] == 16**3000 - 1  # long, yet JSON


def test_a_long_base_60_integer_is_refused_before_it_is_built() -> None:
    """PyYAML builds 1:0:0:... in time square to its length (600 kB took 6 s of CPU,
    a 4 MB body minutes): refused by its length first."""
    started = time.monotonic()
    with pytest.raises(BodyError, match="out of range"):
        parse_yaml("a: 1" + ":0" * 1_000_000 + "\n", max_bytes=4 << 20)
    assert time.monotonic() - started < 10  # built, some 70 s
    assert parse_yaml("a: 1:20\n") == {"a": 80}  # YAML 1.1's base 60, short, still read


def test_yaml_reads_as_the_json_it_stands_for() -> None:
    # Every job is kept as JSON: YAML's dates stay as written (as Kubernetes reads YAML
    # into JSON), and a key that is a number, a boolean or null is JSON's text for it.
    text = "env: {when: 2020-01-01, at: 2001-12-14 21:59:43.10 -5}\nkeys: {2020-01-02: a, 2: b, 1.5: c, true: d, ~: e}\npairs: !!omap [{a: 1}]\n"
    assert parse_yaml(text) == {
        "env": {"when": "2020-01-01", "at": "2001-12-14 21:59:43.10 -5"},
        "keys": {"2020-01-02": "a", "2": "b", "1.5": "c", "true": "d", "null": "e"},
        "pairs": [["a", 1]],
    }
    assert json.loads(json.dumps(parse_yaml(text))) == parse_yaml(text)
    # Keys that are one in a Python dict are two in JSON (1 and true, 0 and false and
    # no): the later silently replaced the earlier, a variable lost. A whole float is
    # written as Go and JavaScript write it (1.0 is 1), others as JSON does.
    assert parse_yaml(
        "env:\n  1: one\n  yes: two\n  2.0: x\n  0: a\n  false: b\n  ~: n\n  1.5: h\n"
    ) == {
        "env": {
            "1": "one",
            "true": "two",
            "2": "x",
            "0": "a",
            "false": "b",
            "null": "n",
            "1.5": "h",
        }
    }
    assert parse_yaml("0: a\nno: c\n", js_yaml=True) == {"0": "a", "no": "c"}
    with pytest.raises(BodyError, match="not valid YAML"):
        parse_yaml("? [a, b]\n: x\n")  # a key no mapping can have
    # A plain "=" (YAML 1.1's "value" key type, which no safe loader builds) and a
    # plain "<<" that is not a key are strings, as Kubernetes' YAML and js-yaml read
    # them: an argument "=" was a 400. A merge key still merges.
    for js_yaml in (False, True):
        text = "args: [a, =, b, <<]\nx: =\nb: &b {k: 1}\nm: {<<: *b, j: 2}\n"
        assert parse_yaml(text, js_yaml=js_yaml) == {
            "args": ["a", "=", "b", "<<"],
            "x": "=",
            "b": {"k": 1},
            "m": {"k": 1, "j": 2},
        }


def test_a_long_string_named_by_many_aliases_is_refused_before_it_is_built() -> None:
    """A 100 kB body naming a 20 kB string 20,000 times stands for 400 MB: refused while
    it is still a graph of nodes (it cost 418 MB once a command rendered it)."""
    text = "big: &b " + "x" * 20_000 + "\nl: [" + ", ".join(["*b"] * 20_000) + "]\n"
    for js_yaml in (False, True):
        with pytest.raises(BodyError, match="characters once its aliases are expanded"):
            parse_yaml(text, js_yaml=js_yaml)
    # A few aliases of it are a document like any other.
    few = "big: &b " + "x" * 20_000 + "\nl: [*b, *b]\n"
    assert len(parse_yaml(few)["l"]) == 2


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("job: {name: !!binary aGVsbG8=}", r"\$\.job\.name: a !!binary value"),
        ("job: {roles: [x, !!set {a, b}]}", r"\$\.job\.roles\[1\]: a !!set"),
        ("job: {!!binary aGk=: x}", r"\$\.job: a key that is a !!binary value"),
        ("job: {.inf: x}", r"\$\.job: a key that is a number out of range"),
        ("job: {cpu: -.inf}", r"\$\.job\.cpu: a number out of range"),
    ],
)
def test_yaml_values_json_has_not_are_refused_with_where_they_are(text: str, said: str) -> None:
    with pytest.raises(BodyError, match=said):
        parse_yaml(text)


@pytest.mark.parametrize("js_yaml", [False, True])
@pytest.mark.parametrize(
    "text", ["a: !!bool x", "a: !!bool", "a: !!int ''", 'a: !!int "-"', "a: !!float ''"]
)
def test_a_value_not_of_its_explicit_tag_is_a_400(text: str, js_yaml: bool) -> None:
    # PyYAML's constructors raised KeyError or IndexError: a 500 on every YAML route.
    with pytest.raises(BodyError, match="not of the type its tag"):
        parse_yaml(text, js_yaml=js_yaml)
