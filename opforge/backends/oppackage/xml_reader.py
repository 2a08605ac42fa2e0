"""Reading Qualcomm OpDef XML (``OpDefCollection``) safely, with a line for every error.

The file may come from anyone, so it is parsed by defusedxml's expat reader with DTDs,
entity declarations and external references all forbidden (a "billion laughs" entity bomb
or an external entity is refused before anything expands) and with a size and depth bound.
The SAX events are collected into a small tree of ``_Element``s that remember their line
(ElementTree forgets it); the tree is then read element by element, and every error says
``file:line``, the element, what was found and what is valid.

>>> pkg = parse_opdef_xml('''<OpDefCollection PackageName="P" Domain="d" Version="1.0">
...   <OpDefList><OpDef><Name>Mul3</Name>
...     <Input><Name>input</Name><Mandatory>true</Mandatory>
...       <Datatype>QNN_DATATYPE_FLOAT_32</Datatype><Shape><Rank>ND</Rank></Shape></Input>
...     <Output><Name>output</Name><Mandatory>true</Mandatory>
...       <Datatype>QNN_DATATYPE_FLOAT_32</Datatype><Shape><Rank>ND</Rank></Shape></Output>
...   </OpDef></OpDefList></OpDefCollection>''')
>>> pkg.name, [op.name for op in pkg.ops], pkg.ops[0].inputs[0].datatypes
('P', ['Mul3'], ('QNN_DATATYPE_FLOAT_32',))
"""

from __future__ import annotations

import difflib
import io
import xml.sax
import xml.sax.handler
from dataclasses import dataclass, field
from pathlib import Path

import defusedxml
from defusedxml.expatreader import DefusedExpatParser

from opforge.backends.oppackage.model import (
    C_NAME_MAX, CONSTRAINT_TYPES, DATATYPES, LAYOUTS, RANKS, Constraint, OpDefinition,
    OpPackage, Supplement, TensorDef, is_c_name,
)
from opforge.errors import ManifestError, shown

__all__ = ["parse_opdef_xml", "load_opdef_xml", "MAX_XML_BYTES", "MAX_XML_DEPTH"]

MAX_XML_BYTES = 16 << 20  # an OpDef file of any real size is a few kB
MAX_XML_DEPTH = 32
_API = "opforge oppackage"


@dataclass
class _Element:
    tag: str
    attrs: dict[str, str]
    line: int
    children: list["_Element"] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.text_parts).strip()

    def all_text(self) -> str:
        parts = [self.text] + [c.all_text() for c in self.children]
        return " ".join(p for p in parts if p)


class _TreeBuilder(xml.sax.handler.ContentHandler):
    def __init__(self, where) -> None:
        super().__init__()
        self.where = where
        self.stack: list[_Element] = []
        self.root: _Element | None = None
        self.locator = None

    def setDocumentLocator(self, locator) -> None:
        self.locator = locator

    def _line(self) -> int:
        return self.locator.getLineNumber() if self.locator is not None else 0

    def startElement(self, name, attrs) -> None:
        if len(self.stack) >= MAX_XML_DEPTH:
            raise ManifestError(f"`{_API}`: {self.where}:{self._line()}: <{name}> — elements "
                                f"nested more than {MAX_XML_DEPTH} deep — valid: an OpDef file "
                                "(about 6 levels) — fix: check the file")
        element = _Element(name, dict(attrs.items()), self._line())
        if self.stack:
            self.stack[-1].children.append(element)
        else:
            self.root = element
        self.stack.append(element)

    def endElement(self, name) -> None:
        self.stack.pop()

    def characters(self, content) -> None:
        if self.stack:
            self.stack[-1].text_parts.append(content)


def _fail(where: str, line: int, element: str, found: str, valid: str, fix: str) -> ManifestError:
    return ManifestError(f"`{_API}`: {where}:{line}: <{element}> — {found} — valid: {valid} — "
                         f"fix: {fix}")


def load_opdef_xml(path: str | Path) -> OpPackage:
    """Read an OpDef XML file (see ``parse_opdef_xml``)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_XML_BYTES + 1)
    except OSError as e:
        raise ManifestError(f"`{_API}`: {path}: cannot read it ({e.strerror or e}) — valid: an "
                            "OpDef XML file — fix: check the path") from None
    return parse_opdef_xml(data, str(path))


def parse_opdef_xml(text: str | bytes, filename: str = "<opdef>") -> OpPackage:
    """Parse OpDef XML text into an :class:`OpPackage` (errors: ``ManifestError``)."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    if len(data) > MAX_XML_BYTES:
        raise ManifestError(f"`{_API}`: {filename}: {len(data)} bytes — valid: at most "
                            f"{MAX_XML_BYTES} — fix: is this really an OpDef file?")
    builder = _TreeBuilder(filename)
    parser = DefusedExpatParser(forbid_dtd=True, forbid_entities=True, forbid_external=True)
    parser.setContentHandler(builder)
    parser.setFeature(xml.sax.handler.feature_external_ges, False)
    parser.setFeature(xml.sax.handler.feature_external_pes, False)
    source = xml.sax.xmlreader.InputSource(filename)
    source.setByteStream(io.BytesIO(data))
    try:
        parser.parse(source)
    except xml.sax.SAXParseException as e:
        raise ManifestError(f"`{_API}`: {filename}:{e.getLineNumber()}: malformed XML — "
                            f"{e.getMessage()} (column {e.getColumnNumber() + 1}) — valid: a "
                            "well-formed OpDefCollection document — fix: correct the XML there") from None
    except defusedxml.DTDForbidden as e:
        raise ManifestError(f"`{_API}`: {filename}:{builder._line() or 1}: <!DOCTYPE {e.name}> — "
                            "a DTD, which opforge refuses (it can declare entities, the way to "
                            "entity bombs and external reads) — valid: an OpDef file without "
                            "<!DOCTYPE> — fix: delete the DOCTYPE declaration") from None
    except defusedxml.EntitiesForbidden as e:
        raise ManifestError(f"`{_API}`: {filename}:{builder._line() or 1}: entity {e.name!r} — an "
                            "entity declaration, which opforge refuses (entity expansion bombs, "
                            "external entities) — valid: plain elements and text — fix: write "
                            "the text out instead of declaring entities") from None
    except defusedxml.ExternalReferenceForbidden as e:
        raise ManifestError(f"`{_API}`: {filename}:{builder._line() or 1}: external reference "
                            f"{shown(e.sysid)} — refused — valid: a self-contained file — fix: "
                            "inline what it refers to") from None
    root = builder.root
    if root is None or root.tag != "OpDefCollection":
        raise _fail(filename, root.line if root else 1, root.tag if root else "?",
                    f"the document's root element is <{root.tag if root else ''}>",
                    "<OpDefCollection PackageName=... Domain=... Version=...>",
                    "an OpDef file starts with <OpDefCollection>")
    return _Reader(filename).collection(root)


class _Reader:
    def __init__(self, where: str) -> None:
        self.where = where

    # --- helpers -------------------------------------------------------------------------
    def fail(self, el: _Element, found: str, valid: str, fix: str) -> ManifestError:
        return _fail(self.where, el.line, el.tag, found, valid, fix)

    def check_children(self, el: _Element, allowed: tuple[str, ...]) -> None:
        for child in el.children:
            if child.tag not in allowed:
                near = difflib.get_close_matches(child.tag, allowed, n=1)
                raise _fail(self.where, child.line, child.tag,
                            f"unknown element inside <{el.tag}>",
                            ", ".join(f"<{a}>" for a in allowed),
                            f"did you mean <{near[0]}>?" if near else "remove it or check the spelling")

    def one(self, el: _Element, tag: str, *, required: bool = True) -> _Element | None:
        found = [c for c in el.children if c.tag == tag]
        if len(found) > 1:
            raise _fail(self.where, found[1].line, tag, f"<{tag}> given twice in <{el.tag}>",
                        "one", "keep one of them")
        if not found and required:
            raise self.fail(el, f"no <{tag}> inside", f"<{el.tag}> with a <{tag}>",
                            f"add <{tag}>...</{tag}>")
        return found[0] if found else None

    def text_of(self, el: _Element, tag: str, *, required: bool = True) -> str | None:
        child = self.one(el, tag, required=required)
        if child is None:
            return None
        if not child.text and required:
            raise self.fail(child, "empty", f"a non-empty <{tag}>", f"write the {tag.lower()}")
        return child.text

    def boolean(self, el: _Element, tag: str, default: bool) -> bool:
        child = self.one(el, tag, required=False)
        if child is None:
            return default
        value = child.text.lower()
        if value not in ("true", "false", "1", "0"):
            raise self.fail(child, f"{shown(child.text)}", "true or false",
                            f"write <{tag}>true</{tag}> or <{tag}>false</{tag}>")
        return value in ("true", "1")

    def choice(self, el: _Element, value: str, valid: tuple[str, ...], what: str) -> str:
        if value not in valid:
            near = difflib.get_close_matches(value, valid, n=1)
            raise self.fail(el, f"unknown {what} {shown(value)}", ", ".join(valid),
                            f"did you mean {near[0]}?" if near else f"use one of the valid {what}s")
        return value

    def attr(self, el: _Element, name: str, *, required: bool = True) -> str:
        value = el.attrs.get(name, "").strip()
        if not value and required:
            raise self.fail(el, f"no {name}=\"...\" attribute", f"<{el.tag} {name}=\"...\">",
                            f"add the {name} attribute")
        return value

    # --- the document --------------------------------------------------------------------
    def collection(self, root: _Element) -> OpPackage:
        unknown = sorted(set(root.attrs) - {"PackageName", "Domain", "Version"})
        if unknown:
            raise self.fail(root, f"unknown attribute {unknown[0]!r}", "PackageName, Domain, Version",
                            "remove it or check the spelling")
        name = self.attr(root, "PackageName")
        if not is_c_name(name):
            raise self.fail(root, f"PackageName {shown(name)} is not a C identifier of at most "
                            f"{C_NAME_MAX} characters",
                            "ASCII letters, digits and '_', not starting with a digit",
                            "rename the package (it names the library libQnn<PackageName>.so "
                            "and the symbol <PackageName>InterfaceProvider)")
        self.check_children(root, ("OpDefList", "SupplementalOpDefList"))
        ops: list[OpDefinition] = []
        for lst in (c for c in root.children if c.tag == "OpDefList"):
            self.check_children(lst, ("OpDef",))
            for el in lst.children:
                op = self.opdef(el)
                first = next((o for o in ops if o.name == op.name), None)
                if first is not None:
                    raise self.fail(el, f"OpDef {op.name!r} declared twice (first at line "
                                    f"{first.line})", "one OpDef per op type", "merge or rename one")
                ops.append(op)
        if not ops:
            raise self.fail(root, "no <OpDef> in any <OpDefList>", "at least one OpDef",
                            "add <OpDefList><OpDef>...</OpDef></OpDefList>")
        supplements = []
        for el in (c for c in root.children if c.tag == "SupplementalOpDefList"):
            supplements.append(self.supplemental_list(el, ops))
        return OpPackage(name, self.attr(root, "Domain", required=False),
                         self.attr(root, "Version", required=False), tuple(ops),
                         tuple(supplements), self.where)

    def opdef(self, el: _Element) -> OpDefinition:
        self.check_children(el, ("Name", "Description", "Reference", "Input", "Output",
                                 "Parameter", "SupportedBackend", "UseDefaultTranslation"))
        name = self.text_of(el, "Name")
        if not is_c_name(name):
            raise self.fail(self.one(el, "Name"), f"op type {shown(name)} is not a C "
                            f"identifier of at most {C_NAME_MAX} characters",
                            "ASCII letters, digits and '_'",
                            "rename the op (it names a C++ function and a source file)")
        description = self.one(el, "Description", required=False)
        refs = tuple((r.attrs.get("Source", ""), r.attrs.get("Url", ""))
                     for r in el.children if r.tag == "Reference")
        tensors = {role: tuple(self.tensor(c, role.lower()) for c in el.children if c.tag == role)
                   for role in ("Input", "Output", "Parameter")}
        if not tensors["Output"]:
            raise self.fail(el, f"OpDef {name!r} declares no <Output>", "at least one Output",
                            "add <Output><Name>output</Name>...</Output>")
        for role, group in tensors.items():
            seen: dict[str, TensorDef] = {}
            for t in group:
                if t.name in seen:
                    raise _fail(self.where, t.line, role, f"{role.lower()} {t.name!r} of OpDef "
                                f"{name!r} declared twice (first at line {seen[t.name].line})",
                                "unique names", "rename one")
                seen[t.name] = t
        backends = tuple(self.choice(c, c.text.upper(), ("CPU", "GPU", "DSP", "HTP", "LPAI"),
                                     "backend")
                         for c in el.children if c.tag == "SupportedBackend")
        return OpDefinition(name, description.all_text() if description else "", refs,
                            tensors["Input"], tensors["Output"], tensors["Parameter"], backends,
                            self.boolean(el, "UseDefaultTranslation", False), False, el.line)

    _COMMON = ("Name", "Description", "Constraint", "Mandatory", "Datatype", "Shape", "Default")
    _EXTRA = {"input": ("Repeated", "IsStaticTensor"), "output": ("Repeated",),
              "parameter": ("Enumeration",)}

    def tensor(self, el: _Element, role: str) -> TensorDef:
        self.check_children(el, self._COMMON + self._EXTRA[role])
        name = self.text_of(el, "Name")
        description = self.one(el, "Description", required=False)
        datatypes = tuple(self.choice(c, c.text, DATATYPES, "datatype")
                          for c in el.children if c.tag == "Datatype")
        if not datatypes:
            raise self.fail(el, f"{role} {name!r} has no <Datatype>",
                            "one or more <Datatype>QNN_DATATYPE_...</Datatype>",
                            "add the datatypes it accepts (e.g. QNN_DATATYPE_FLOAT_32)")
        rank, layout, text = self.shape(el, name, role)
        enumeration: tuple[str, ...] = ()
        enum_el = self.one(el, "Enumeration", required=False)
        if enum_el is not None:
            self.check_children(enum_el, ("Enum",))
            enumeration = tuple(c.text for c in enum_el.children)
            if not enumeration:
                raise self.fail(enum_el, "no <Enum>", "one or more <Enum>NAME</Enum>",
                                "list the values or drop <Enumeration>")
        default_el = self.one(el, "Default", required=False)
        return TensorDef(role, name, description.all_text() if description else "",
                         self.boolean(el, "Mandatory", True), datatypes, rank, layout, text,
                         default_el.text if default_el is not None else None, enumeration,
                         self.boolean(el, "Repeated", False),
                         self.boolean(el, "IsStaticTensor", False),
                         self.constraints(el), el.line)

    def shape(self, el: _Element, name: str, role: str, *, required: bool = True):
        shape = self.one(el, "Shape", required=False)
        if shape is None:  # QNN requires one; opforge reads a missing Shape as any rank
            return ("ND", "UNDEFINED", "") if required else (None, None, None)
        self.check_children(shape, ("Rank", "Layout", "Text"))
        rank_el = self.one(shape, "Rank", required=required)
        rank = self.choice(rank_el, rank_el.text.upper(), RANKS, "rank") if rank_el is not None else None
        layout_el = self.one(shape, "Layout", required=False)
        layout = (self.choice(layout_el, layout_el.text.upper(), LAYOUTS, "layout")
                  if layout_el is not None else ("UNDEFINED" if required else None))
        text = self.text_of(shape, "Text", required=False)
        return rank, layout, (text or "") if required else text

    def constraints(self, el: _Element) -> tuple[Constraint, ...]:
        out = []
        for c in (c for c in el.children if c.tag == "Constraint"):
            kind = self.choice(c, c.attrs.get("Type", ""), CONSTRAINT_TYPES, "constraint Type")
            out.append(Constraint(kind, c.all_text(), c.attrs.get("id", "")))
        return tuple(out)

    def supplemental_list(self, el: _Element, ops: list[OpDefinition]):
        backend = self.choice(el, self.attr(el, "Backend").upper(),
                              ("CPU", "GPU", "DSP", "HTP", "LPAI"), "backend")
        self.check_children(el, ("SupportedOps", "SupplementalOpDef"))
        names = {op.name: op for op in ops}
        supported: list[str] = []
        for lst in (c for c in el.children if c.tag == "SupportedOps"):
            self.check_children(lst, ("OpName",))
            for c in lst.children:
                if c.text not in names:
                    raise self.fail(c, f"op {shown(c.text)} has no OpDef", ", ".join(names),
                                    "list only ops the OpDefList declares")
                supported.append(c.text)
        sups = []
        for s in (c for c in el.children if c.tag == "SupplementalOpDef"):
            self.check_children(s, ("Name", "Input", "Output", "Parameter", "Constraint",
                                    "OnlyDefaultSupported"))
            name = self.text_of(s, "Name")
            op = names.get(name)
            if op is None:
                raise self.fail(s, f"SupplementalOpDef for {shown(name)}, which has no OpDef",
                                ", ".join(names), "check the name")
            tensors = []
            for t in s.children:
                if t.tag not in ("Input", "Output", "Parameter"):
                    continue
                self.check_children(t, ("Name", "Datatype", "Shape", "Constraint"))
                tname = self.text_of(t, "Name")
                role = t.tag.lower()
                declared = {"input": op.inputs, "output": op.outputs, "parameter": op.parameters}[role]
                if tname not in [d.name for d in declared]:
                    raise self.fail(t, f"{role} {shown(tname)} is not one of OpDef {name!r}'s",
                                    ", ".join(d.name for d in declared) or "(none)", "check the name")
                datatypes = tuple(self.choice(c, c.text, DATATYPES, "datatype")
                                  for c in t.children if c.tag == "Datatype")
                _, layout, text = self.shape(t, tname, role, required=False)
                tensors.append((role, tname, datatypes, layout, text, self.constraints(t)))
            only = self.one(s, "OnlyDefaultSupported", required=False)
            sups.append(Supplement(name, self.constraints(s), tuple(tensors),
                                   self.boolean(s, "OnlyDefaultSupported", False)
                                   if only is not None else None, s.line))
        return (backend, tuple(supported), tuple(sups))
