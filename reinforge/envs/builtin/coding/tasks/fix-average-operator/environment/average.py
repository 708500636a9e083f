def average(a, b):
    """The mean of the two numbers a and b."""
    return (a + b) * 2
