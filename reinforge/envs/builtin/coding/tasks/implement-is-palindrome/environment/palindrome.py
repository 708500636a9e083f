def is_palindrome(text):
    """Whether `text` reads the same forwards and backwards."""
    raise NotImplementedError
