def greet(name):
    """The greeting "Hi, <name>!"."""
    raise NotImplementedError
