"""The config reference, generated from the config models: every section and key with its
type, allowed values, default and description.

    python -m simpipe.config.docs > docs/config.md

The models are the one home of what a key means (``Field(description=...)``, and a model's
docstring for its section), so the reference cannot drift from what ``simpipe validate``
accepts; ``tests/config/test_config_docs.py`` fails while ``docs/config.md`` differs from this
output. A union of sections keyed on ``kind`` is rendered once per kind.
"""

from __future__ import annotations

import inspect
import json
import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic.types import AllowInfNan
from pydantic_core import PydanticUndefined

REGENERATE = "python -m simpipe.config.docs > docs/config.md"
_HEADER = (
    "<!-- Generated from the config models by `{command}`. Edit the models' "
    "descriptions, not this file. -->"
)
_DEEPEST_HEADING = 4
# The discriminator of a union keyed on kind needs no description of its own.
_KIND_ROW = "selects this kind: the keys below belong to it"


def config_reference(root: type[BaseModel] | None = None, title: str = "Config reference") -> str:
    """The Markdown reference of ``root`` (default: the whole ``simpipe.config.model.Config``)."""
    root = _whole_config(root)
    lines = [f"# {title}", "", _HEADER.format(command=REGENERATE), ""]
    intro = _docstring(root)
    if intro:
        lines += [intro, ""]
    tops = [name for name, field in root.model_fields.items() if _section_models(field)]
    if tops:
        lines += ["Sections: " + " · ".join(f"[`[{name}]`](#{_slug(f'[{name}]')})"
                                             for name in tops), ""]
    writer = _Writer()
    writer.section(root, path=[], depth=0, heading=None)
    lines += writer.lines
    return "\n".join(lines).rstrip("\n") + "\n"


def undescribed_keys(root: type[BaseModel] | None = None) -> list[str]:
    """Every key path under ``root`` whose field has no description (should be none)."""
    root = _whole_config(root)
    missing: list[str] = []
    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel], path: list[str], kind_variant: bool = False) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            if kind_variant and name == "kind":
                continue
            sections = _section_models(field)
            if sections:
                if field.description is None and len(sections) > 1:
                    missing.append(".".join([*path, name]))
                for variant in sections:
                    walk(variant.model, [*path, name, *variant.path_suffix],
                         kind_variant=bool(variant.label and variant.label.startswith("kind")))
            elif not field.description:
                missing.append(".".join([*path, name]))

    walk(root, [])
    return missing


# --- sections -------------------------------------------------------------------------------


class _Variant:
    """One model a field holds: the only one, or one member of a union."""

    def __init__(self, model: type[BaseModel], label: str | None, path_suffix: list[str]):
        self.model = model
        self.label = label  # "kind `slurm`" for a kind union, the member's name otherwise
        self.path_suffix = path_suffix  # ["<name>"] for a table of sections


def _section_models(field: FieldInfo) -> list[_Variant]:
    """The models a field holds as sub-sections (empty for a plain key)."""
    annotation = _strip_optional(_strip_annotated(field.annotation))
    suffix: list[str] = []
    if get_origin(annotation) is dict:
        annotation = _strip_annotated(get_args(annotation)[1])
        suffix = ["<name>"]
    if _is_model(annotation):
        return [_Variant(annotation, None, suffix)]
    members = _union_members(annotation)
    if members and all(_is_model(m) for m in members):
        kinds = [_kind_of(m) for m in members]
        if all(kinds):
            return [_Variant(m, f"kind `{k}`", suffix) for m, k in zip(members, kinds, strict=True)]
        names = _member_names(members)
        return [_Variant(m, n, suffix) for m, n in zip(members, names, strict=True)]
    return []


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        # A model shown once; a second place that holds it links to the first.
        self.anchors: dict[type[BaseModel], tuple[str, str]] = {}

    def section(self, model: type[BaseModel], path: list[str], depth: int,
                heading: str | None, label: str | None = None, about: str | None = None,
                kind_variant: bool = False) -> None:
        if heading is not None:
            self.lines += [f"{_hashes(depth)} {heading}", ""]
            if about:
                self.lines += [_sentence(about), ""]
            if model in self.anchors:
                text, anchor = self.anchors[model]
                self.lines += [f"The same keys as [{text}](#{anchor}).", ""]
                return
            self.anchors[model] = (heading, _slug(heading))
            doc = _docstring(model)
            if doc:
                self.lines += [doc, ""]
        rows, subsections = [], []
        for name, field in model.model_fields.items():
            variants = _section_models(field)
            if variants:
                subsections.append((name, field, variants))
            elif kind_variant and name == "kind" and not field.description:
                rows.append(_row(name, field, _KIND_ROW))
            else:
                rows.append(_row(name, field))
        if kind_variant:
            # The kind first: it decides which of the other rows apply.
            rows.sort(key=lambda row: not row.startswith("| `kind` |"))
        if rows:
            self.lines += ["| key | type and allowed values | default | description |",
                           "|---|---|---|---|", *rows, ""]
        for name, field, variants in subsections:
            sub_path = [*path, name]
            shown = ".".join(sub_path + variants[0].path_suffix)
            sub_heading = f"`[{shown}]`" + (f" ({label})" if label else "")
            if len(variants) == 1:
                about = field.description or ""
                if _default_of(field) is None:
                    about = f"{_sentence(about)} Optional: not set unless given.".strip()
                self.section(variants[0].model, sub_path, depth + 1, sub_heading, label, about)
                continue
            self.lines += [f"{_hashes(depth + 1)} {sub_heading}", ""]
            if field.description:
                self.lines += [_sentence(field.description), ""]
            headings = [f"`[{shown}]` {v.label}" for v in variants]
            default = _default_kind(_default_of(field))
            self.lines += ["One of: " + ", ".join(f"[{v.label}](#{_slug(h)})"
                                                  for v, h in zip(variants, headings, strict=True))
                           + (f"; default: {default}." if default else "."), ""]
            for variant, variant_heading in zip(variants, headings, strict=True):
                self.section(variant.model, sub_path, depth + 2, variant_heading,
                             label or variant.label, kind_variant=variant.label.startswith("kind"))


def _row(name: str, field: FieldInfo, description: str | None = None) -> str:
    description = description or field.description or ""
    return (f"| `{name}` | {_cell(_type_text(field.annotation, field.metadata))} | "
            f"{_cell(_default_text(field))} | {_cell(description)} |")


# --- types, constraints, defaults -----------------------------------------------------------

_SINGULAR = {int: "integer", float: "number", str: "string", bool: "`true` or `false`"}
_PLURAL = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}


def _type_text(annotation: Any, metadata: list[Any] = (), plural: bool = False) -> str:
    """``integer, 1 to 10``, ``one of "a", "b"``, ``list of strings, at least 1``."""
    constraints = list(metadata)
    while get_origin(annotation) is Annotated:
        annotation, *extra = get_args(annotation)
        constraints += extra
    annotation = _strip_optional(annotation)
    while get_origin(annotation) is Annotated:
        annotation, *extra = get_args(annotation)
        constraints += extra
    constraints = _flatten(constraints)
    finite = any(isinstance(c, AllowInfNan) and not c.allow_inf_nan for c in constraints)
    origin = get_origin(annotation)
    if origin is Literal:
        values = [f"`{_toml(v)}`" for v in get_args(annotation)]
        text = values[0] if len(values) == 1 else "one of " + ", ".join(values)
    elif origin is list:
        (item,) = get_args(annotation) or (Any,)
        text = "list of " + _type_text(item, plural=True)
    elif origin is dict:
        args = get_args(annotation)
        value = args[1] if len(args) == 2 else Any
        text = ("tables" if plural else "table") + (
            "" if value is Any else " of " + _type_text(value, plural=True))
    elif annotation in _SINGULAR:
        text = (_PLURAL if plural else _SINGULAR)[annotation]
        if annotation is float and finite:
            text = "finite " + text
    elif _union_members(annotation):
        text = " or ".join(_type_text(m, plural=plural) for m in _union_members(annotation))
    elif annotation is Any:
        text = "any values" if plural else "any value"
    else:
        text = getattr(annotation, "__name__", str(annotation))
    bounds = _bounds_text(constraints, sized=origin in (list, dict))
    return f"{text}, {bounds}" if bounds else text


def _bounds_text(constraints: list[Any], sized: bool) -> str:
    low = high = None
    for c in constraints:
        if isinstance(c, at.Ge):
            low = (">=", c.ge)
        elif isinstance(c, at.Gt):
            low = (">", c.gt)
        elif isinstance(c, at.Le):
            high = ("<=", c.le)
        elif isinstance(c, at.Lt):
            high = ("<", c.lt)
        elif isinstance(c, at.MinLen) and sized:
            low = ("items>=", c.min_length)
        elif isinstance(c, at.MaxLen) and sized:
            high = ("items<=", c.max_length)
    if low and high and low[0] == ">=" and high[0] == "<=":
        return f"{_number(low[1])} to {_number(high[1])}"
    parts = []
    for bound in (low, high):
        if bound is None:
            continue
        op, value = bound
        if op == "items>=":
            parts.append(f"at least {_number(value)}")
        elif op == "items<=":
            parts.append(f"at most {_number(value)}")
        else:
            parts.append(f"{op} {_number(value)}")
    return " and ".join(parts)


def _default_of(field: FieldInfo) -> Any:
    if field.default_factory is not None:
        return field.default_factory()  # type: ignore[call-arg]
    return field.default


def _default_text(field: FieldInfo) -> str:
    value = _default_of(field)
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "not set"
    return f"`{_toml(value)}`"


def _default_kind(value: Any) -> str:
    kind = getattr(value, "kind", None)
    return f"kind `{kind}`" if isinstance(kind, str) else ""


def _toml(value: Any) -> str:
    """A value as it is written in a TOML file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_key(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, BaseModel):
        return _toml(value.model_dump(mode="json"))
    return str(value)


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        value = int(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:g}"


# --- small helpers --------------------------------------------------------------------------


def _flatten(constraints: list[Any]) -> list[Any]:
    # Field(ge=...) inside Annotated arrives as a FieldInfo holding its own metadata.
    out: list[Any] = []
    for c in constraints:
        out += c.metadata if isinstance(c, FieldInfo) else [c]
    return out


def _whole_config(root: type[BaseModel] | None) -> type[BaseModel]:
    if root is not None:
        return root
    # Imported here: the whole config imports every package's section; the helpers of this
    # module (and its tests' small models) need none of them.
    from simpipe.config.model import Config

    return Config


def _strip_annotated(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _union_members(annotation: Any) -> list[Any]:
    if get_origin(annotation) not in (Union, types.UnionType):
        return []
    return [_strip_annotated(a) for a in get_args(annotation) if a is not type(None)]


def _strip_optional(annotation: Any) -> Any:
    """``X | None`` -> ``X`` (with its ``Annotated`` constraints); anything else unchanged."""
    if get_origin(annotation) not in (Union, types.UnionType):
        return annotation
    others = [a for a in get_args(annotation) if a is not type(None)]
    return others[0] if len(others) == 1 else annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _kind_of(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("kind")
    if field is None:
        return None
    values = get_args(_strip_annotated(field.annotation))
    if get_origin(_strip_annotated(field.annotation)) is Literal and len(values) == 1:
        return str(values[0])
    return None


def _member_names(members: list[type[BaseModel]]) -> list[str]:
    """``CategoricalAttribute``, ``IntegerAttribute`` -> ``categorical``, ``integer``."""
    names = [m.__name__ for m in members]
    suffix = names[0]
    while suffix and not all(n.endswith(suffix) and n != suffix for n in names):
        suffix = suffix[1:]
    return [n.removesuffix(suffix).lower() if suffix else n for n in names]


def _docstring(model: type[BaseModel]) -> str:
    """The model's docstring, then those of the models it extends (a section inherits their
    keys, so it inherits what they say about them)."""
    docs = [inspect.cleandoc(c.__dict__["__doc__"]) for c in model.__mro__
            if isinstance(c, type) and issubclass(c, BaseModel) and c is not BaseModel
            and c.__dict__.get("__doc__")]
    return "\n\n".join(docs)


def _sentence(text: str) -> str:
    """A description shown as a paragraph: capitalised, ending in a full stop."""
    text = _cell(text)
    if text and not text.endswith("."):
        text += "."
    return text[:1].upper() + text[1:]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _hashes(depth: int) -> str:
    return "#" * min(depth + 1, _DEEPEST_HEADING)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading (lower case, punctuation dropped, spaces -> -)."""
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower())
    return text.replace(" ", "-")


def main() -> None:
    print(config_reference(), end="")


if __name__ == "__main__":
    main()

