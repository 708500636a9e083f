def count_up(n):
    """The list [1, 2, ..., n] (empty when n < 1)."""
    return list(range(1, n))
