def minutes_to_seconds(minutes):
    """The number of seconds in `minutes` minutes."""
    return minutes * 100
