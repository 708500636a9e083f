"""The config reference (`docs/config.md`), generated from the config classes themselves so
that it cannot drift from the code: every key, its type, its default and its docstring.

`python -m reinforge.config_reference > docs/config.md` rewrites it; a test fails when the
file is not what this module writes.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from reinforge.config import MOVED, UNREAD, Config, EvalConfig, ServeConfig
from reinforge.sim.config import SimConfig
from reinforge.types import sections_of, variant_tag

ROOTS: list[tuple[str, type[BaseModel]]] = [
    ("reinforge train / reinforge sft", Config),
    ("reinforge eval", EvalConfig),
    ("reinforge serve", ServeConfig),
    ("reinforge sim", SimConfig),
]

HEADER = """# Config reference

Generated from the config classes by `python -m reinforge.config_reference > docs/config.md`;
a test checks that it is current. Every command reads its tree from an optional TOML file
and dotted `key=value` overrides (values in TOML syntax: `run.steps=40`,
`env.args.difficulty=2`, `engine.dtype="bfloat16"`); an unknown key or a wrong type is one
line on stderr and exit code 2. A section that appears in several trees is the same class
with the same defaults. Variants are chosen by their tag (`kind = ...`, or `loop.mode`);
an override that names no tag keeps the default variant, and a key of another variant is
refused, naming the variants that hold it. An override or a flag of a key the command does
not read is refused the same way, and so is a key that moved (the last sections list
them).

The knob budget: the `reinforge train` tree has {train_keys} keys (leaf keys, a variant's
counted once however many variants hold it, `env.args` one key; `.ci/run` prints the
count). Every key is one more thing a user reads past and a test must cover, so a new key
replaces one, or its change says why it cannot.
"""

UNREAD_HEADER = """
## Keys a command does not read

Set by an override or a flag, each is refused in one line naming it, with the reason below;
a config file may hold it, so that one file serves train, sft and sim. The longest prefix
listed for a command decides; every key of no listed prefix is read. A command run one way
(an eval of a model served at a URL) also refuses the keys listed for that way, and one
that loads an engine those its engine does not read.

| command | key | |
|---|---|---|"""

MOVED_HEADER = """
## Keys that moved

A config that sets one (in a file too) is refused in one line naming its new key.

| key | now |
|---|---|"""


def reference() -> str:
    parts = [HEADER.format(train_keys=train_keys())]
    for title, root in ROOTS:
        parts.append(f"\n## `{title}`: `{root.__name__}`")
        parts.extend(_section(root, ""))
    parts.append(UNREAD_HEADER)
    for command, rules in UNREAD.items():
        name, _, way = command.partition(", ")
        shown = (name if name == "any command" else f"`reinforge {name}`") + (
            f", {way}" if way else ""
        )
        for prefix, why in rules.items():
            key = f"`{prefix}`" if prefix else "(any key)"
            parts.append(f"| {shown} | {key} | {why or 'read'} |")
    parts.append(MOVED_HEADER)
    for old, (new, variant) in MOVED.items():
        parts.append(f"| `{old}` | `{new}`, with `{variant}` |")
    return "\n".join(parts)


def train_keys() -> int:
    """The knob budget's count: the keys of `reinforge train`'s tree (`.ci/run` prints it)."""
    return len(leaf_keys(Config))


def leaf_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    """The dotted keys a user can set in `model`'s tree: the knob budget counts them. A
    key that several variants of a section hold (each one's `kind`) is one knob."""
    keys: set[str] = set()
    for name, info in model.model_fields.items():
        nested = sections_of(info.annotation)
        if nested:
            for section in nested:
                keys |= leaf_keys(section, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


def _section(model: type[BaseModel], prefix: str) -> list[str]:
    """A table of the plain keys of `model`, then each subsection after it."""
    rows: list[str] = []
    later: list[str] = []
    tag = variant_tag(model)
    for name, info in model.model_fields.items():
        if tag is not None and name == tag[0]:  # the variant's heading names it
            continue
        key = f"{prefix}{name}"
        nested = sections_of(info.annotation)
        if len(nested) == 1 and not _is_union(info):
            later.append(f"\n### `{key}`")
            later.extend(_doc(nested[0], info))
            later.extend(_section(nested[0], f"{key}."))
        elif nested:
            later.append(f"\n### `{key}`")
            later.extend(_doc(None, info))
            for variant in nested:
                tag = variant_tag(variant)
                label = f"`{key}` with {tag[0]} = `{tag[1]}`" if tag else f"`{key}`"
                later.append(f"\n#### {label}")
                later.extend(_doc(variant, None))
                later.extend(_section(variant, f"{key}."))
        else:
            rows.append(
                f"| `{key}` | {_type(info.annotation)} | {_default(info)} | {_text(info)} |"
            )
    table = ["| key | type | default | meaning |", "|---|---|---|---|", *rows] if rows else []
    return [*(["", *table] if table else []), *later]


def _doc(model: type[BaseModel] | None, info: FieldInfo | None) -> list[str]:
    texts = [_clean(model.__doc__)] if model is not None and model.__doc__ else []
    if info is not None and info.description:
        texts.append(_clean(info.description))
    if info is not None and _optional(info.annotation):
        texts.append("Optional: absent (None) by default.")
    return ["", " ".join(texts)] if texts else []


def _is_union(info: FieldInfo) -> bool:
    return (
        len(sections_of(info.annotation)) > 1
        or typing.get_origin(info.annotation) is typing.Annotated
    )


def _optional(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)


def _type(annotation: Any) -> str:
    if typing.get_origin(annotation) is Literal:
        return " \\| ".join(f'"{value}"' for value in typing.get_args(annotation))
    if typing.get_origin(annotation) is typing.Annotated:
        return _type(typing.get_args(annotation)[0])
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return " \\| ".join(_type(arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return "none"
    if typing.get_origin(annotation) in (list, dict):
        return str(annotation).replace("typing.", "").replace("pathlib.", "")
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if value is None:
        return "none"
    if isinstance(value, BaseModel):
        return "see below"
    return f"`{value!s}`" if not isinstance(value, str) else f'`"{value}"`'


def _text(info: FieldInfo) -> str:
    description = _clean(info.description or "")
    constraints = [_bound(m) for m in info.metadata if _bound(m)]
    if constraints:
        description = f"{description} ({', '.join(constraints)})".strip()
    return description.replace("|", "\\|")


def _bound(metadata: Any) -> str:
    """`Ge(ge=1)` as `>= 1`; other metadata says nothing a reader needs."""
    for attribute, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        value = getattr(metadata, attribute, None)
        if value is not None:
            return f"{sign} {value}"
    return ""


def _clean(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":
    print(reference(), end="")
