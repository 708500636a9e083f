"""The kinds of file work: edit a setting, delete or append a line, create a file, copy,
make a folder, move, rename."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from reinforge.envs.builtin.coding.generated.task_dir import (
    Spec,
    solve_script,
    wording,
    workdir_path,
)

WORDS = (
    "alpha amber apple aspen birch cedar cobalt copper coral delta ember falcon fern "
    "garnet harbor hazel indigo ivory jade juniper kestrel lemon linen maple marble "
    "meadow nickel olive onyx orchid pebble pine quartz raven river saffron sage "
    "silver slate spruce summit thistle topaz tulip umber velvet willow zephyr"
).split()
KEYS = (
    "port timeout retries workers threads mode region owner theme color limit "
    "replicas version channel backend cache_size batch_size max_users log_level"
).split()
STEMS = "app config settings service server db worker cache deploy site build".split()
NAMES = "notes report todo readme changelog summary draft plan log list".split()
TEXT_EXTS = ".txt .md .log .csv".split()


@dataclass
class Format:
    """A config file format: how a key and its value make a line."""

    ext: str
    line: Callable[[str, str], str]
    head: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)


FORMATS = [
    Format(".properties", lambda k, v: f"{k}={v}"),
    Format(".env", lambda k, v: f"{k.upper()}={v}"),
    Format(".ini", lambda k, v: f"{k} = {v}", head=["[main]"]),
    Format(".yaml", lambda k, v: f"{k}: {v}"),
    Format(".toml", lambda k, v: f"{k} = {v}", head=["[tool]"]),
    Format(".json", lambda k, v: f'  "{k}": {v},', head=["{"], tail=["}"]),
]


def _value(rng: random.Random, like: str = "") -> str:
    """A number or a word; with `like`, another value of its kind (so a TOML or JSON file
    stays valid)."""
    numeric = like.isdigit() if like else rng.random() < 0.6
    while True:
        value = str(rng.randint(2, 9999)) if numeric else rng.choice(WORDS)
        if value != like.strip('"'):
            return f'"{value}"' if like.startswith('"') else value


def _config(
    rng: random.Random, formats: list[Format] = FORMATS
) -> tuple[Format, str, list[tuple[str, str]]]:
    """A config file: its format, its name and 3-5 settings."""
    fmt = rng.choice(formats)
    name = ".env" if fmt.ext == ".env" else rng.choice(STEMS) + fmt.ext
    keys = rng.sample(KEYS, rng.randint(3, 5))
    values = [_value(rng) for _ in keys]
    if fmt.ext in (".json", ".toml"):  # strings are quoted there
        values = [v if v.isdigit() else f'"{v}"' for v in values]
    return fmt, name, list(zip(keys, values, strict=True))


def _render(fmt: Format, settings: list[tuple[str, str]]) -> list[str]:
    lines = [fmt.line(k, v) for k, v in settings]
    if fmt.ext == ".json":
        lines[-1] = lines[-1].rstrip(",")
    return fmt.head + lines + fmt.tail


def _text_lines(rng: random.Random) -> list[str]:
    return [" ".join(rng.sample(WORDS, rng.randint(1, 3))) for _ in range(rng.randint(1, 4))]


def edit(rng: random.Random) -> Spec:
    fmt, name, settings = _config(rng)
    i = rng.randrange(len(settings))
    key, old = settings[i]
    new = _value(rng, like=old)
    shown_key = key.upper() if fmt.ext == ".env" else key
    before = _render(fmt, settings)
    after = _render(fmt, settings[:i] + [(key, new)] + settings[i + 1 :])
    old_line, new_line = (
        before[i + len(fmt.head)].strip(),
        after[i + len(fmt.head)].strip(),
    )
    wordings = [
        "In `{p}`, change `{k}` from `{o}` to `{n}`. Keep the other lines as they are.",
        "Set `{k}` to `{n}` in `{p}` (it is `{o}` now). Leave everything else unchanged.",
        "`{p}` has `{k}` set to `{o}`. Change it to `{n}` and keep the rest of the file.",
        # Without the old value the agent has to read the file to find the line.
        "In `{p}`, set `{k}` to `{n}`. Keep every other setting exactly as it is.",
        "Change `{k}` in `{p}` to `{n}`; the other lines stay as they are.",
    ]
    instruction = wording(rng, wordings, p=workdir_path(name), k=shown_key, o=old, n=new)
    return Spec(
        "edit-config",
        instruction,
        {name: before},
        solve_script(f"sed -i 's/{old_line.rstrip(',')}/{new_line.rstrip(',')}/' {name}"),
        {name: after},
    )


def delete(rng: random.Random) -> Spec:
    # One setting per line, no brackets or trailing commas to keep right.
    fmt, name, settings = _config(rng, [f for f in FORMATS if not f.head])
    i = rng.randrange(len(settings))
    shown_key = settings[i][0].upper() if fmt.ext == ".env" else settings[i][0]
    line = fmt.line(*settings[i])
    wordings = [
        "Remove the line that sets `{k}` from `{p}`. Keep every other line.",
        "Delete the `{k}` setting from `{p}`; the other lines stay as they are.",
    ]
    instruction = wording(rng, wordings, p=workdir_path(name), k=shown_key)
    return Spec(
        "delete-line",
        instruction,
        {name: _render(fmt, settings)},
        solve_script(f"sed -i '/^{line}$/d' {name}"),
        {name: _render(fmt, settings[:i] + settings[i + 1 :])},
    )


def append(rng: random.Random) -> Spec:
    name = rng.choice(NAMES) + rng.choice(TEXT_EXTS)
    lines = _text_lines(rng)
    added = " ".join(rng.sample(WORDS, rng.randint(1, 3)))
    wordings = [
        "Add the line `{l}` at the end of `{p}`.",
        "Append a new last line `{l}` to `{p}`, keeping the lines already there.",
    ]
    instruction = wording(rng, wordings, p=workdir_path(name), l=added)
    return Spec(
        "append-line",
        instruction,
        {name: lines},
        solve_script(f"echo '{added}' >> {name}"),
        {name: [*lines, added]},
    )


def create(rng: random.Random) -> Spec:
    form = rng.random()
    if form < 0.5:
        fmt, name, settings = _config(rng)
        if form < 0.25:
            lines, instruction = _described(rng, fmt, name, settings)
        else:
            lines = _render(fmt, settings)
            instruction = _listed(rng, name, lines)
    else:
        name, lines = rng.choice(NAMES) + rng.choice(TEXT_EXTS), _text_lines(rng)
        instruction = _listed(rng, name, lines)
    return Spec("create-file", instruction, {}, _heredoc(name, lines), {name: lines})


def _listed(rng: random.Random, name: str, lines: list[str]) -> str:
    """An instruction that gives the file's lines as they must be."""
    if len(lines) == 1 and rng.random() < 0.5:
        return f"Create a file `{workdir_path(name)}` whose only line is `{lines[0]}`."
    block = "\n".join(f"    {line}" for line in lines)
    return f"Create `{workdir_path(name)}` with exactly these lines:\n\n{block}\n"


SECTIONS = {".ini": ("an INI file", "section"), ".toml": ("a TOML file", "table")}


def _described(
    rng: random.Random, fmt: Format, name: str, settings: list[tuple[str, str]]
) -> tuple[list[str], str]:
    """A config file's lines and an instruction that describes them instead of listing
    them, as people ask: the agent has to lay out the section, the JSON object or the
    lines itself."""
    path = workdir_path(name)
    if fmt.ext == ".json":
        obj = "{" + ", ".join(f'"{k}": {v}' for k, v in settings) + "}"
        return [obj], f"Create a file `{path}` that contains this JSON object:\n\n    {obj}\n"
    shown = [fmt.line(k, v) for k, v in settings]
    listed = ", ".join(f"`{line}`" for line in shown[:-1]) + f" and `{shown[-1]}`"
    if fmt.ext in SECTIONS:
        what, part = SECTIONS[fmt.ext]
        section = rng.choice(STEMS + KEYS)
        wordings = [
            "Create {w} `{p}` with one {t}, `[{s}]`, that sets {l}.",
            "Write {w} `{p}` holding a single {t} `[{s}]` with the settings {l}.",
        ]
        instruction = wording(rng, wordings, w=what, p=path, t=part, s=section, l=listed)
        return [f"[{section}]", *shown], instruction
    return (
        shown,
        f"Create `{path}` that sets {listed}, one setting per line in this order.",
    )


def _heredoc(name: str, lines: list[str]) -> str:
    return solve_script(f"cat > {name} <<'EOF'", *lines, "EOF")


def copy(rng: random.Random) -> Spec:
    name = rng.choice(NAMES + STEMS) + rng.choice(TEXT_EXTS + [".conf", ".ini"])
    target = rng.choice([f"{name}.bak", f"{name}.orig", f"backup-{name}"])
    lines = _text_lines(rng)
    wordings = [
        "Make a copy of `{p}` named `{t}`. Both files must have the original content.",
        "Back up `{p}` as `{t}`; keep the original where it is.",
    ]
    instruction = wording(rng, wordings, p=workdir_path(name), t=workdir_path(target))
    return Spec(
        "copy-file",
        instruction,
        {name: lines},
        solve_script(f"cp {name} {target}"),
        {name: lines, target: lines},
    )


def make_dir(rng: random.Random) -> Spec:
    folder = rng.choice(["", "data/", "src/", "var/"]) + rng.choice(WORDS + STEMS)
    if rng.random() < 0.5:
        wordings = [
            "Create an empty directory `{d}`.",
            "Make a new, empty folder `{d}`.",
        ]
        instruction = wording(rng, wordings, d=workdir_path(folder))
        script = solve_script(f"mkdir -p {folder}")
        return Spec("make-dir", instruction, {}, script, {}, empty_dirs=[workdir_path(folder)])
    name = rng.choice(NAMES) + rng.choice(TEXT_EXTS)
    line = " ".join(rng.sample(WORDS, rng.randint(1, 3)))
    wordings = [
        "Create a directory `{d}` and in it a file `{f}` whose only line is `{l}`.",
        "Make a new folder `{d}` holding one file, `{f}`, with the single line `{l}`.",
    ]
    instruction = wording(rng, wordings, d=workdir_path(folder), f=name, l=line)
    script = solve_script(f"mkdir -p {folder}", f"echo '{line}' > {folder}/{name}")
    return Spec("make-dir", instruction, {}, script, {f"{folder}/{name}": [line]})


def move(rng: random.Random) -> Spec:
    name = rng.choice(NAMES) + rng.choice(TEXT_EXTS)
    folder = rng.choice(["docs", "archive", "old", "notes", "reports", "backup"])
    lines = _text_lines(rng)
    wordings = [
        "Move `{p}` into a new directory `{d}`, keeping its name.",
        "Put `{p}` in a new folder `{d}` (same file name); `{p}` must be gone after.",
    ]
    instruction = wording(rng, wordings, p=workdir_path(name), d=workdir_path(folder))
    return Spec(
        "move-file",
        instruction,
        {name: lines},
        solve_script(f"mkdir -p {folder}", f"mv {name} {folder}/"),
        {f"{folder}/{name}": lines},
        absent=[workdir_path(name)],
    )


def rename(rng: random.Random) -> Spec:
    stem, ext = rng.choice(NAMES), rng.choice(TEXT_EXTS)
    name = stem + ext
    target = rng.choice(
        [stem + e for e in TEXT_EXTS if e != ext] + [f"{stem}-{rng.choice(WORDS)}{ext}"]
    )
    lines = _text_lines(rng)
    wordings = [
        "Rename `{p}` to `{t}`.",
        "Give `{p}` the new name `{t}`; its content stays the same.",
    ]
    instruction = wording(rng, wordings, p=workdir_path(name), t=workdir_path(target))
    return Spec(
        "rename-file",
        instruction,
        {name: lines},
        solve_script(f"mv {name} {target}"),
        {target: lines},
        absent=[workdir_path(name)],
    )
