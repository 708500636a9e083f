def encode(text):
    """Run-length encoding of `text` (which has no digits)."""
    raise NotImplementedError


def decode(code):
    """The text whose run-length encoding is `code`."""
    raise NotImplementedError
