def is_negative(n):
    """True when the number n is less than 0."""
    raise NotImplementedError
