def count_words(text):
    """The number of words in `text` (words are separated by whitespace)."""
    return len(text.split(" "))
