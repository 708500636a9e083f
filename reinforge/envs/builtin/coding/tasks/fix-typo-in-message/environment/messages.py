def welcome(name):
    """The welcome message for `name`."""
    return "Welcom, " + name + "!"
