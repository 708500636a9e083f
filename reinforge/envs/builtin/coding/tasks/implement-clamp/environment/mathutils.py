def clamp(value, low, high):
    """`value` limited to the range [low, high]."""
    raise NotImplementedError
