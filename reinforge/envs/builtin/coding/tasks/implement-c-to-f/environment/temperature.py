def c_to_f(celsius):
    """Degrees Fahrenheit for `celsius` degrees Celsius, as a float."""
    raise NotImplementedError
