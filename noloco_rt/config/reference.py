"""The configuration reference (docs/config.md, `noloco-rt config reference`): every field of
every section with its type, default, variable and doc string, rendered as Markdown.

Doc strings are read from the sections' source: a field is documented by the string literal
on the line after it, and a section by its class doc string. Fault-injection knobs
(schema.is_fault_injection) are left out: they are for tests and `noloco-rt chaos`.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from dataclasses import dataclass

from noloco_rt.config.loading import ENV_PREFIX
from noloco_rt.config.schema import SECTIONS, is_fault_injection
from noloco_rt.config.toml_out import toml_value

REGENERATE = ".venv/bin/noloco-rt config reference > docs/config.md"


@dataclass(frozen=True, kw_only=True)
class FieldReference:
    section: str
    name: str
    type: str
    """The annotation as written in the source, e.g. "float | None"."""
    default: str
    """The default as TOML would write it; "unset" for None."""
    doc: str
    """The field's doc string, dedented; "" when it has none."""

    @property
    def key(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def variable(self) -> str:
        return f"{ENV_PREFIX}{self.section.upper()}_{self.name.upper()}"


def class_docs(cls: type) -> tuple[str, dict[str, str]]:
    """A dataclass's own doc string ("" if none) and its fields' doc strings, from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    fields: dict[str, str] = {}
    for statement, following in zip(node.body, [*node.body[1:], None], strict=True):
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        if (isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            fields[statement.target.id] = inspect.cleandoc(following.value.value)
    return ast.get_docstring(node) or "", fields


def _default_text(field: dataclasses.Field) -> str:
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        value = field.default
    return "unset" if value is None else toml_value(value)


def section_fields(section: str) -> list[FieldReference]:
    """The documented fields of one section, in declaration order, fault injection left out."""
    cls = SECTIONS[section]
    _, docs = class_docs(cls)
    return [FieldReference(section=section, name=f.name, type=str(f.type), default=_default_text(f),
                           doc=docs.get(f.name, ""))
            for f in dataclasses.fields(cls) if not is_fault_injection(f.name)]


def _markdown_text(text: str) -> str:
    """Doc string text safe in Markdown: `<name>` outside code spans would be read as HTML."""
    parts = text.split("`")
    return "`".join(part.replace("<", "\\<") if i % 2 == 0 else part for i, part in enumerate(parts))


def render_reference() -> str:
    """docs/config.md: a short preamble, then one heading per section and one per field."""
    lines = [
        "# Configuration reference",
        "",
        f"Generated from the config's doc strings by `noloco-rt config reference`; do not edit: "
        f"regenerate with `{REGENERATE}`.",
        "",
        "Every field is set, last one winning, by its default, a TOML file (`--config FILE`, "
        "`[section]` tables), its `NOLOCO_<SECTION>_<FIELD>` variable (lists comma-separated) "
        "and `--set section.field=VALUE`. `noloco-rt config show` prints the result. Knobs that "
        "inject faults for tests are not listed here (docs/testing.md, \"Chaos tooling\").",
        "",
        "Sections: " + ", ".join(f"[{name}](#{name})" for name in SECTIONS) + ".",
        "",
    ]
    for section, cls in SECTIONS.items():
        section_doc, _ = class_docs(cls)
        lines += [f"## {section}", ""]
        if section_doc:
            lines += [_markdown_text(section_doc), ""]
        for ref in section_fields(section):
            lines += [f"### `{ref.key}`", "",
                      f"`{ref.type}`, default `{ref.default}`, variable `{ref.variable}`", ""]
            if ref.doc:
                lines += [_markdown_text(ref.doc), ""]
    return "\n".join(lines)
