def is_adult(age):
    """True when a person of this age (in years) is 18 or older."""
    return age > 18
