def reverse_words(sentence):
    """The words of `sentence` in reverse order, joined by single spaces."""
    raise NotImplementedError
