def larger(a, b):
    """The larger of the two numbers a and b."""
    if a > b:
        return b
    return b
