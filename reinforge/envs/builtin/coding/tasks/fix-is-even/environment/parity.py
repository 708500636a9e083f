def is_even(n):
    """True when the integer n is even."""
    return n % 2 == 1
