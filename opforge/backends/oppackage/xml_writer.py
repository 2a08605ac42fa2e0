"""``OpPackage`` → OpDef XML text (for a package declared in the YAML manifest: the project
``opforge oppackage new`` makes keeps its OpDef as ``config/<Package>.xml``).

``parse_opdef_xml(to_opdef_xml(p))`` equals ``p`` up to source lines (a round-trip test
checks it).
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from opforge.backends.oppackage.model import Constraint, OpPackage, TensorDef

__all__ = ["to_opdef_xml"]


def _el(tag: str, text: str, indent: str) -> str:
    return f"{indent}<{tag}>{escape(text)}</{tag}>\n"


def _constraints(cs: tuple[Constraint, ...], indent: str) -> str:
    out = ""
    for c in cs:
        ident = f" id={quoteattr(c.id)}" if c.id else ""
        out += f"{indent}<Constraint{ident} Type={quoteattr(c.type)}>{escape(c.text)}</Constraint>\n"
    return out


def _tensor(t: TensorDef, indent: str) -> str:
    tag = t.role.capitalize()
    i2 = indent + "  "
    out = f"{indent}<{tag}>\n" + _el("Name", t.name, i2)
    if t.description:
        out += f"{i2}<Description><Content>{escape(t.description)}</Content></Description>\n"
    out += _constraints(t.constraints, i2)
    out += _el("Mandatory", "true" if t.mandatory else "false", i2)
    out += "".join(_el("Datatype", d, i2) for d in t.datatypes)
    out += f"{i2}<Shape><Rank>{t.rank}</Rank><Layout>{t.layout}</Layout>"
    out += (f"<Text>{escape(t.shape_text)}</Text>" if t.shape_text else "") + "</Shape>\n"
    if t.default is not None:
        out += _el("Default", t.default, i2)
    if t.enumeration:
        out += f"{i2}<Enumeration>" + "".join(f"<Enum>{escape(e)}</Enum>" for e in t.enumeration)
        out += "</Enumeration>\n"
    if t.role in ("input", "output") and t.repeated:
        out += _el("Repeated", "true", i2)
    if t.role == "input" and t.is_static_tensor:
        out += _el("IsStaticTensor", "true", i2)
    return out + f"{indent}</{tag}>\n"


def to_opdef_xml(package: OpPackage) -> str:
    out = (f'<?xml version="1.0" encoding="UTF-8"?>\n<OpDefCollection PackageName='
           f'{quoteattr(package.name)} Domain={quoteattr(package.domain)} '
           f'Version={quoteattr(package.version)}>\n  <OpDefList>\n')
    for op in package.ops:
        out += "    <OpDef>\n" + _el("Name", op.name, "      ")
        if op.description:
            out += f"      <Description><Content>{escape(op.description)}</Content></Description>\n"
        for source, url in op.references:
            out += f"      <Reference Source={quoteattr(source)} Url={quoteattr(url)}/>\n"
        for t in (*op.inputs, *op.outputs, *op.parameters):
            out += _tensor(t, "      ")
        out += "".join(_el("SupportedBackend", b, "      ") for b in op.supported_backends)
        if op.use_default_translation:
            out += _el("UseDefaultTranslation", "true", "      ")
        out += "    </OpDef>\n"
    out += "  </OpDefList>\n"
    for backend, supported, sups in package.supplements:
        out += f"  <SupplementalOpDefList Backend={quoteattr(backend)}>\n"
        if supported:
            out += "    <SupportedOps>" + "".join(f"<OpName>{escape(n)}</OpName>" for n in supported)
            out += "</SupportedOps>\n"
        for s in sups:
            out += "    <SupplementalOpDef>\n" + _el("Name", s.name, "      ")
            for role, name, datatypes, layout, text, cs in s.tensors:
                tag = role.capitalize()
                out += f"      <{tag}>\n" + _el("Name", name, "        ")
                out += "".join(_el("Datatype", d, "        ") for d in datatypes)
                if layout is not None or text is not None:
                    out += "        <Shape>" + (f"<Layout>{layout}</Layout>" if layout else "")
                    out += (f"<Text>{escape(text)}</Text>" if text else "") + "</Shape>\n"
                out += _constraints(cs, "        ") + f"      </{tag}>\n"
            out += _constraints(s.constraints, "      ")
            if s.only_default_supported is not None:
                out += _el("OnlyDefaultSupported", "true" if s.only_default_supported else "false",
                           "      ")
            out += "    </SupplementalOpDef>\n"
        out += "  </SupplementalOpDefList>\n"
    return out + "</OpDefCollection>\n"
