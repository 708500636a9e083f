def count_vowels(text):
    """How many characters of text are vowels (a, e, i, o, u, upper or lower case)."""
    raise NotImplementedError
