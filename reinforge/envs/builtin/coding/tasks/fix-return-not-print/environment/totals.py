def total(prices):
    """The sum of the list `prices`."""
    print(sum(prices))
