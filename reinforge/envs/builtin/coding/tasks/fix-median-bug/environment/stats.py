def median(values):
    """The median of a non-empty list of numbers."""
    middle = len(values) // 2
    return values[middle]
