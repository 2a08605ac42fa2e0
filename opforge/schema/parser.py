"""A recursive-descent parser for ATen function schemas, with caret diagnostics.

The grammar is the canonical spelling torchgen prints (``", "`` between arguments,
``" -> "`` before the returns), so the parse is lossless: :func:`parse_schema` asserts
``str(result) == text``. A malformed string raises :class:`SchemaError` that shows the
string with a caret under the offending column and says what was expected there::

    schema ::= name "(" [arguments] ") -> " returns
    name   ::= [ident "::"] ident ["." ident]
    arguments ::= item (", " item)*          item ::= argument | "*"
    argument  ::= type " " ident ["=" default]
    type   ::= ident ["(" annotation ")"] ("?" | "[" [int] "]")*
    returns ::= "()" | type | "(" return (", " return)* ")"
    return ::= type [" " ident]

Limits: a type takes at most ``MAX_TYPE_DEPTH`` (32) suffixes ``?`` and ``[]`` (ATen's deepest
is ``Tensor?[]``: 2); the types print, compare and hash recursively, so ``Tensor[]...[]``
500 deep would otherwise be a RecursionError, not a SchemaError. A list size has at most 18
digits. Nothing else nests: returns and annotations take one level of parentheses, and
defaults are scanned, not parsed. A schema longer than ``SHOWN_COLUMNS`` is shown in an
error as the part around the caret.
"""

from __future__ import annotations

import re

from opforge.errors import SchemaError, shown
from opforge.schema.defaults import check_default
from opforge.schema.model import (
    BASE_TYPES,
    Annotation,
    Argument,
    Arguments,
    BaseType,
    FunctionSchema,
    ListType,
    OperatorName,
    OptionalType,
    Return,
    Type,
)

__all__ = ["parse_schema", "parse_type", "MAX_TYPE_DEPTH"]

MAX_TYPE_DEPTH = 32  # '?' and '[]' suffixes of one type
SHOWN_COLUMNS = 160  # an error shows this much of a longer schema, around the caret

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ALIAS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\*")


class _Cursor:
    """A position in the schema text; every failure goes through :meth:`fail`."""

    def __init__(self, text: str, api: str) -> None:
        self.text = text
        self.pos = 0
        self.api = api

    def fail(self, expected: str, pos: int | None = None, found: str | None = None) -> SchemaError:
        pos = self.pos if pos is None else pos
        if found is None:
            found = repr(self.text[pos]) if pos < len(self.text) else "the end of the string"
        shown_text, shown_pos = _around(self.text, pos)
        caret = " " * shown_pos + "^"
        return SchemaError(
            f"`{self.api}`: malformed schema at column {pos + 1} — found {found}, "
            f"expected {expected}\n  {shown_text}\n  {caret}"
        )

    def peek(self, s: str) -> bool:
        return self.text.startswith(s, self.pos)

    def eat(self, s: str) -> bool:
        if self.peek(s):
            self.pos += len(s)
            return True
        return False

    def expect(self, s: str, what: str | None = None) -> None:
        if not self.eat(s):
            raise self.fail(what or f"{s!r}")

    def ident(self, what: str) -> str:
        m = _IDENT.match(self.text, self.pos)
        if not m:
            raise self.fail(what)
        self.pos = m.end()
        return m.group()

    def at_end(self) -> bool:
        return self.pos >= len(self.text)


def _around(text: str, pos: int) -> tuple[str, int]:
    """``text`` cut to SHOWN_COLUMNS around ``pos`` (with "…" where cut), and pos in it."""
    if len(text) <= SHOWN_COLUMNS:
        return text, pos
    start = max(0, min(pos - SHOWN_COLUMNS // 2, len(text) - SHOWN_COLUMNS))
    end = start + SHOWN_COLUMNS
    head = "…" if start > 0 else ""
    tail = "…" if end < len(text) else ""
    return head + text[start:end] + tail, pos - start + len(head)


def parse_schema(text: str, *, api: str = "FunctionSchema.parse") -> FunctionSchema:
    """Parse ``text`` into a :class:`FunctionSchema`; raise :class:`SchemaError` if malformed.

    >>> str(parse_schema("aten::relu(Tensor self) -> Tensor"))
    'aten::relu(Tensor self) -> Tensor'
    """
    if not isinstance(text, str):
        raise SchemaError(f"`{api}`: a schema is a string, got {type(text).__name__}")
    cur = _Cursor(text, api)
    name = _parse_name(cur)
    cur.expect("(", "'(' to open the argument list")
    arguments = _parse_arguments(cur)
    if not cur.eat(") -> "):
        if cur.peek(")") and not cur.peek(") -> "):
            cur.pos += 1
            raise cur.fail("' -> ' and the return type(s) after the argument list")
        raise cur.fail("', ' before the next argument, or ')' to close the argument list")
    returns = _parse_returns(cur)
    if not cur.at_end():
        raise cur.fail("the end of the schema after the return type(s)")
    schema = FunctionSchema(name, arguments, returns)
    # Lossless by construction; this guards the printer against drifting from the parser.
    assert str(schema) == text, (str(schema), text)
    return schema


def parse_type(text: str) -> Type:
    """Parse a bare type such as ``Tensor?[]`` or ``int[2]`` (no annotation)."""
    cur = _Cursor(text, "parse_type")
    t, ann = _parse_type(cur)
    if ann is not None or not cur.at_end():
        raise cur.fail("the end of the type")
    return t


def _parse_name(cur: _Cursor) -> OperatorName:
    first = cur.ident("an operator name such as 'my_ops::mul3' or 'add.Tensor'")
    namespace = None
    if cur.eat("::"):
        namespace = first
        first = cur.ident("an operator name after '::'")
    overload = ""
    if cur.eat("."):
        overload = cur.ident("an overload name after '.' (such as 'out' or 'Tensor')")
    return OperatorName(namespace, first, overload)


def _parse_arguments(cur: _Cursor) -> Arguments:
    positional: list[Argument] = []
    kwarg_only: list[Argument] = []
    seen: dict[str, int] = {}
    if cur.peek(")"):
        return Arguments()
    star_pos = None
    while True:
        if cur.peek("*"):
            if star_pos is not None:
                raise cur.fail("a single '*' (keyword-only marker) per schema")
            star_pos = cur.pos
            cur.pos += 1
        else:
            arg, name_pos = _parse_argument(cur)
            if arg.name in seen:
                raise cur.fail(
                    f"a unique argument name ({shown(arg.name)} is already argument "
                    f"{seen[arg.name] + 1})",
                    pos=name_pos,
                    found=f"a second {shown(arg.name)}",
                )
            seen[arg.name] = len(seen)
            (kwarg_only if star_pos is not None else positional).append(arg)
        if not cur.eat(", "):
            break
    if star_pos is not None and not kwarg_only:
        raise cur.fail("at least one keyword-only argument after '*'", pos=star_pos, found="'*'")
    return Arguments(tuple(positional), tuple(kwarg_only))


def _parse_argument(cur: _Cursor) -> tuple[Argument, int]:
    t, annotation = _parse_type(cur)
    cur.expect(" ", "a space and then the argument name after the type")
    name_pos = cur.pos
    name = cur.ident("an argument name")
    default = None
    if cur.eat("="):
        start = cur.pos
        default = _scan_default(cur)
        problem = check_default(t, default)
        if problem:
            raise cur.fail(problem, pos=start, found=f"default {shown(default)} for type '{t}'")
    return Argument(name, t, default, annotation), name_pos


def _scan_default(cur: _Cursor) -> str:
    """The default's text: up to the next top-level ', ' or ')' (quotes and [] respected)."""
    text, i, depth, quote = cur.text, cur.pos, 0, None
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif depth == 0 and (ch == ")" or text.startswith(", ", i)):
            break
        i += 1
    if quote:
        raise cur.fail(f"a closing {quote} for the string default", pos=i)
    if i == cur.pos:
        raise cur.fail("a default value after '='")
    value = text[cur.pos : i]
    cur.pos = i
    return value


def _parse_type(cur: _Cursor) -> tuple[Type, Annotation | None]:
    start = cur.pos
    name = cur.ident("a type such as 'Tensor', 'int[]', 'Scalar' or 'Tensor?'")
    if name not in BASE_TYPES:
        raise cur.fail(
            "a known type (" + ", ".join(sorted(BASE_TYPES)) + ")",
            pos=start,
            found=f"unknown type {shown(name)}",
        )
    t: Type = BaseType(name)
    annotation = None
    if cur.peek("("):
        annotation = _parse_annotation(cur)
    depth = 0
    while True:
        if cur.peek("?") or cur.peek("["):
            depth += 1
            if depth > MAX_TYPE_DEPTH:
                raise cur.fail(f"at most {MAX_TYPE_DEPTH} '?' and '[]' suffixes on one type "
                               "(MAX_TYPE_DEPTH; ATen's deepest type, 'Tensor?[]', has 2)",
                               found=f"suffix {depth} of type '{name}'")
        if cur.eat("?"):
            if isinstance(t, OptionalType):
                raise cur.fail("at most one '?' in a row", pos=cur.pos - 1)
            t = OptionalType(t)
        elif cur.eat("["):
            size = None
            m = re.compile(r"[0-9]+").match(cur.text, cur.pos)
            if m:
                if len(m.group()) > 18:
                    raise cur.fail("a list size of at most 18 digits",
                                   found=f"a size of {len(m.group())} digits")
                size = int(m.group())
                if size < 1:
                    raise cur.fail("a list size of at least 1", pos=cur.pos)
                cur.pos = m.end()
            cur.expect("]", "']' to close the list type (e.g. 'int[]' or 'int[2]')")
            t = ListType(t, size)
        else:
            return t, annotation


def _parse_annotation(cur: _Cursor) -> Annotation:
    cur.expect("(")
    before = _alias_set(cur)
    is_write = cur.eat("!")
    after: tuple[str, ...] = ()
    if cur.eat(" -> "):
        after = _alias_set(cur)
    cur.expect(")", "')' to close the alias annotation (e.g. 'Tensor(a!)')")
    return Annotation(before, is_write, after)


def _alias_set(cur: _Cursor) -> tuple[str, ...]:
    names = []
    while True:
        m = _ALIAS.match(cur.text, cur.pos)
        if not m:
            raise cur.fail("an alias set name such as 'a' (as in 'Tensor(a!)')")
        names.append(m.group())
        cur.pos = m.end()
        if not cur.eat("|"):
            return tuple(names)


def _parse_returns(cur: _Cursor) -> tuple[Return, ...]:
    if cur.eat("()"):
        return ()
    if not cur.eat("("):
        t, annotation = _parse_type(cur)
        name = cur.ident("a return name") if cur.eat(" ") else None
        return (Return(t, name, annotation),)
    open_pos = cur.pos - 1
    returns: list[Return] = []
    names: set[str] = set()
    while True:
        t, annotation = _parse_type(cur)
        name = None
        if cur.eat(" "):
            name = cur.ident("a return name")
            if name in names:
                raise cur.fail("a unique return name", pos=cur.pos - len(name))
            names.add(name)
        returns.append(Return(t, name, annotation))
        if cur.eat(")"):
            break
        if not cur.eat(", "):
            raise cur.fail("', ' before the next return, or ')' to close the returns")
    if len(returns) == 1:
        raise cur.fail(
            "a single return written without parentheses (e.g. '-> Tensor' or '-> Tensor out')",
            pos=open_pos,
            found="'('",
        )
    return tuple(returns)
