def calc(width, height):
    """The area of a width x height rectangle."""
    return width * height


def square_area(side):
    """The area of a square."""
    return calc(side, side)
