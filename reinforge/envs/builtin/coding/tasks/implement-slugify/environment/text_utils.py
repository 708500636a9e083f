def slugify(text):
    """The URL slug of a title."""
    raise NotImplementedError
