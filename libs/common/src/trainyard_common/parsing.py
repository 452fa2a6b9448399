"""Bounded parsers for everything a user sends: no body can cost a service more than its
size's worth of time and memory, and every refusal says what was wrong.

JSON: a size limit, a nesting limit checked on the text before parsing (so no
RecursionError), strict UTF-8, no NaN or Infinity and no number that overflows to one,
no lone surrogate in any string. YAML: the same size and nesting limits, and the size of
the document *as expanded* bounded while it is still a graph of nodes: aliases make a
440-byte "billion laughs" stand for 9⁹ nodes, which is refused in milliseconds instead
of built. Both answer :class:`BodyError`, which HTTP layers turn into 400 (or 413 for
size), naming the problem and where.

Either gives JSON's data model, which is what every job is kept as: a YAML timestamp
stays the text it was written as (as Kubernetes reads YAML into JSON), a key that is a
number, a boolean or null is written as JSON writes it, and a value JSON has none for
(``!!binary``, ``!!set``) is refused with where it is.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Hashable
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_BODY = 4 * 1024 * 1024
MAX_DEPTH = 64
# Nodes a YAML document may stand for once its aliases are expanded.
MAX_YAML_NODES = 200_000


class BodyError(ValueError):
    """A body that cannot be accepted; ``status`` is 400 or 413."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _text(raw: bytes | str, max_bytes: int, kind: str) -> str:
    size = len(raw)
    if size > max_bytes:
        raise BodyError(f"{kind} body of {size} bytes is larger than {max_bytes} bytes", 413)
    if isinstance(raw, str):
        text = raw
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BodyError(
                f"{kind} body is not UTF-8: byte {exc.start} ({raw[exc.start : exc.start + 1]!r})"
            ) from None
    _no_surrogates(text, kind)
    return text


def _no_surrogates(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BodyError(
            f"{where}: a lone surrogate (U+{ord(text[exc.start]):04X}) at character {exc.start}"
        ) from None


# JSON strings, escapes and all (one left open runs to the end), and what is left of a
# text without them that is not a bracket: both removed by the regex engine, so what
# Python steps over is the brackets outside strings, not every character.
_STRINGS = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS = re.compile(r"[^\[\]{}]++")
_DEPTH_TOKENS = re.compile(f"{_STRINGS.pattern}|[\\[\\]{{}}]", re.DOTALL)
# A \u escape of a UTF-16 surrogate: the one way a lone surrogate gets into parsed JSON
# (the text itself is strict UTF-8, checked first).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def json_depth(text: str, max_depth: int) -> None:
    """Refuse JSON nested deeper than ``max_depth``, found on the text itself."""
    if text.count("[") + text.count("{") <= max_depth:
        return  # not that many brackets at all, in strings or out
    depth = 0
    for char in _NOT_BRACKETS.sub("", _STRINGS.sub("", text)):
        if char in "[{":
            depth += 1
            if depth > max_depth:
                raise BodyError(
                    f"JSON nested deeper than {max_depth} levels "
                    f"(at character {_too_deep_at(text, max_depth)})"
                )
        else:
            depth -= 1


def _too_deep_at(text: str, max_depth: int) -> int:
    """Where in ``text`` the nesting first goes past ``max_depth`` (it does)."""
    depth = 0
    for token in _DEPTH_TOKENS.finditer(text):
        position = token.start()
        char = text[position]
        if char in "[{":
            depth += 1
            if depth > max_depth:
                return position
        elif char != '"':
            depth -= 1
    raise AssertionError("json_depth found it deeper")


def _constant(name: str) -> Any:
    raise BodyError(f"JSON {name} is not a number this API accepts")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BodyError(f"JSON number {text[:40]} is out of range")
    return value


def parse_json(raw: bytes | str, max_bytes: int = MAX_BODY, max_depth: int = MAX_DEPTH) -> Any:
    text = _text(raw, max_bytes, "JSON")
    json_depth(text, max_depth)
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_float)
    except BodyError:
        raise
    except ValueError as exc:
        raise BodyError(f"request body is not valid JSON: {exc}") from None
    if _SURROGATE_ESCAPE.search(text):  # numbers out of range are refused while parsing
        _check_strings(value, "JSON body")
    return value


def _check_strings(value: Any, where: str) -> None:
    """Every string of ``value`` (keys too) encodable (\\ud800 escapes make lone
    surrogates in JSON); iterative, so depth costs no stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _no_surrogates(item, where)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, composing only: the node graph is checked before any
    Python object is built from it; nesting is refused while composing."""

    def __init__(self, stream: str, max_depth: int) -> None:
        super().__init__(stream)
        self._depth = 0
        self._max_depth = max_depth

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > self._max_depth:
                raise BodyError(f"YAML nested deeper than {self._max_depth} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        """A mapping whose number, boolean and null keys are text as each is built, as
        Kubernetes' YAML reads them: in a Python dict ``1`` and ``true`` are one key
        (``0``, ``false`` and ``no`` another), and the later silently replaced the
        earlier. Keys JSON has no text for are left for _as_json to refuse, saying
        where."""
        if not isinstance(node, MappingNode):
            return super().construct_mapping(node, deep)  # type: ignore[arg-type]
        self.flatten_mapping(node)
        mapping: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            if _json_scalar(key):
                key = _key_text(key)
            elif not isinstance(key, Hashable):
                return super().construct_mapping(node, deep)
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping


def _as_written(loader: yaml.SafeLoader, node: Node) -> Any:
    return loader.construct_scalar(node)  # type: ignore[arg-type]


_BoundedLoader.add_constructor("tag:yaml.org,2002:timestamp", _as_written)
# A plain "<<" is a merge key only as a key (flatten_mapping merges those before any
# constructor runs); as a value it is the string, as Kubernetes' YAML and js-yaml read it.
_BoundedLoader.add_constructor("tag:yaml.org,2002:merge", _as_written)
# A plain "=" is YAML 1.1's "value" key type, which no safe loader builds (PyYAML refused
# the document): Kubernetes' YAML and js-yaml read it as the string "=".
_BoundedLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:value"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class _JsYamlLoader(_BoundedLoader):
    """The bounded loader reading plain scalars as js-yaml 3 does (OpenPAI's rest-server
    reads job YAML with it, ``yaml.safeLoad``): only true/false (any case of the word)
    are booleans, not yes/no/on/off; ``1e-4`` is a number, and so on, by its
    lib/js-yaml/type/{null,bool,int,float}.js."""


_YAML11_TAGS = tuple(f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float"))
_JsYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _YAML11_TAGS]
    for first, resolvers in _BoundedLoader.yaml_implicit_resolvers.items()
}
for _tag, _pattern, _first in (
    ("null", r"^(?:~|null|Null|NULL|)$", "~nN"),
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    (
        "int",
        r"^[-+]?(?:0b[01_]*[01]|0x[0-9a-fA-F_]*[0-9a-fA-F]|0[0-7_]*[0-7]|0"
        r"|[1-9](?:[0-9_]*[0-9])?|[1-9][0-9_]*(?::[0-5]?[0-9])+)$",
        "-+0123456789",
    ),
    (
        "float",
        r"^(?:[-+]?(?:0|[1-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?"
        r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))(?<!_)$",
        "-+0123456789.",
    ),
):
    _JsYamlLoader.add_implicit_resolver(
        f"tag:yaml.org,2002:{_tag}",
        re.compile(_pattern),
        [*_first, *([""] if _tag == "null" else [])],
    )


# YAML's 0x and 0b integers are not held to int()'s 4300 digits, but writing one out is:
# no integer JSON would carry back has more bits than this (4300 digits, about 14284).
MAX_INT_BITS = 14_000
# Nor is an integer written longer than this (a 0b one of MAX_INT_BITS, with room): the
# base-60 form (1:0:0:...) costs PyYAML time in the square of its length (600 kB: 6 s).
MAX_INT_TEXT = 15_000


def _bounded_int(loader: yaml.SafeLoader, node: Node) -> Any:
    text = node.value if isinstance(node.value, str) else ""
    if len(text) > MAX_INT_TEXT:
        mark = node.start_mark
        raise BodyError(
            f"YAML body at line {mark.line + 1}, column {mark.column + 1}: an integer of "
            f"{len(text)} characters is out of range"
        )
    return yaml.SafeLoader.construct_yaml_int(loader, node)  # type: ignore[arg-type]


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _bounded_int)


def _as_json(value: Any, path: str = "$") -> Any:
    """``value`` (a YAML document, its nesting already bounded) as JSON's data model."""
    if isinstance(value, str):
        _no_surrogates(value, f"YAML body at {path}")
        return value
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise BodyError(f"YAML body at {path}: a number out of range (an integer too long)")
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise BodyError(f"YAML body at {path}: a number out of range ({value})")
        return value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            name = _json_key(key, path)
            out[name] = _as_json(item, f"{path}.{name}")
        return out
    if isinstance(value, (list, tuple)):  # !!omap and !!pairs build tuples
        return [_as_json(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise BodyError(f"YAML body at {path}: {_yaml_kind(value)}, which JSON has no value for")


def _json_scalar(key: Any) -> bool:
    """A key JSON writes as text: null, a boolean, a number in range."""
    return (
        key is None
        or (isinstance(key, (bool, int)) and key.bit_length() <= MAX_INT_BITS)
        or (isinstance(key, float) and math.isfinite(key))
    )


def _key_text(key: Any) -> str:
    """A number, boolean or null key as the text Kubernetes' YAML (Go's shortest form)
    and js-yaml (JavaScript's String) both give it: ``1.0`` is ``1``, ``true`` ``true``."""
    if isinstance(key, float) and key.is_integer() and abs(key) < 1e21:
        return str(int(key))
    return json.dumps(key)


def _json_key(key: Any, path: str) -> str:
    if isinstance(key, str):
        _no_surrogates(key, f"YAML body at {path}")
        return key
    if _json_scalar(key):
        return _key_text(key)
    raise BodyError(
        f"YAML body at {path}: a key that is {_yaml_kind(key)}, which JSON keys cannot be"
    )


def _yaml_kind(value: Any) -> str:
    if isinstance(value, bytes):
        return "a !!binary value"
    if isinstance(value, (set, frozenset)):
        return "a !!set"
    if isinstance(value, float):
        return f"a number out of range ({value})"
    return f"a {type(value).__name__}"


def _expanded_size(node: Node, max_nodes: int, max_depth: int, max_chars: int) -> int:
    """How many nodes ``node`` stands for with every alias expanded (shared nodes are
    counted once per use), refusing past ``max_nodes``, past ``max_chars`` characters of
    scalars (a long string named by many aliases: gigabytes once written out as JSON,
    from a small body), or deeper than ``max_depth``."""
    sizes: dict[int, int] = {}
    chars: dict[int, int] = {}
    # Iterative post-order walk: (node, depth, children done?).
    stack: list[tuple[Node, int, bool]] = [(node, 1, False)]
    on_path: set[int] = set()
    while stack:
        current, depth, done = stack.pop()
        key = id(current)
        if done:
            on_path.discard(key)
            if isinstance(current, SequenceNode):
                children = current.value
            elif isinstance(current, MappingNode):
                children = [part for pair in current.value for part in pair]
            else:
                children = []
            total = 1 + sum(sizes[id(child)] for child in children)
            if total > max_nodes:
                raise BodyError(
                    f"YAML document stands for more than {max_nodes} values once its "
                    "aliases are expanded"
                )
            text = len(current.value) if isinstance(current, ScalarNode) else 0
            text += sum(chars[id(child)] for child in children)
            if text > max_chars:
                raise BodyError(
                    f"YAML document stands for more than {max_chars} characters once its "
                    "aliases are expanded"
                )
            sizes[key], chars[key] = total, text
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise BodyError("YAML document refers to itself (a recursive alias)")
        if depth > max_depth:
            raise BodyError(f"YAML nested deeper than {max_depth} levels")
        on_path.add(key)
        stack.append((current, depth, True))
        if isinstance(current, SequenceNode):
            stack.extend((child, depth + 1, False) for child in current.value)
        elif isinstance(current, MappingNode):
            for k, v in current.value:
                stack.append((k, depth + 1, False))
                stack.append((v, depth + 1, False))
    return sizes[id(node)]


def parse_yaml(
    raw: bytes | str,
    max_bytes: int = MAX_BODY,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_YAML_NODES,
    *,
    js_yaml: bool = False,
) -> Any:
    """One YAML document (safe types only), bounded as the module says: its scalars
    read as YAML 1.1 reads them (Kubernetes' YAML does: yes and no are booleans), or,
    with ``js_yaml``, as js-yaml 3 does (OpenPAI's)."""
    text = _text(raw, max_bytes, "YAML")
    try:
        # Its reader refuses what YAML does not allow (a NUL) as it is made.
        loader = (_JsYamlLoader if js_yaml else _BoundedLoader)(text, max_depth)
    except yaml.YAMLError as exc:
        raise BodyError(f"request body is not valid YAML: {exc}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        # Aliases may make a document larger than its text, not past twice what a body
        # may be.
        _expanded_size(node, max_nodes, max_depth, 2 * max_bytes)
        value = loader.construct_document(node)
    except BodyError:
        raise
    except yaml.YAMLError as exc:
        raise BodyError(f"request body is not valid YAML: {exc}") from None
    except ValueError as exc:
        # An integer int() will not make: more than 4300 decimal digits (0x and 0b ones
        # are made, and refused by _as_json's MAX_INT_BITS).
        raise BodyError(f"request body holds a number out of range: {exc}") from None
    except RecursionError:
        raise BodyError(f"YAML nested deeper than {max_depth} levels") from None
    except (KeyError, IndexError, TypeError):
        # PyYAML's constructors for an explicit tag meet a value not of it (`!!bool x`,
        # `!!int ''`, `!!float ''`) with a bare lookup or index.
        raise BodyError(
            "request body is not valid YAML: a value is not of the type its tag "
            "(!!bool, !!int, !!float, ...) says"
        ) from None
    finally:
        loader.dispose()
    return _as_json(value)


def parse_json_or_yaml(raw: bytes | str, max_bytes: int = MAX_BODY) -> Any:
    """JSON, else YAML (a file whose type is not known)."""
    try:
        return parse_json(raw, max_bytes)
    except BodyError as exc:
        if exc.status == 413:
            raise
    return parse_yaml(raw, max_bytes)
