def greet(name, greeting="Goodbye"):
    """A greeting for `name`, such as "Hello, Ann!"."""
    return f"{greeting}, {name}!"
