import pytest

from reinforge.envs.parsers import extract_tag, follows_think_answer, last_integer, strip_think


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("The answer is 85.", 85),
        ("37 + 48 = 85", 85),
        ("-12", -12),
        ("about 1,234 apples", 1234),
        ("37,48,85", 85),  # not a thousands grouping: three numbers
        ("85.0", 85),
        ("85.5", None),
        ("no digits", None),
    ],
)
def test_last_integer(text, value):
    assert last_integer(text) == value


def test_tags_and_think_blocks():
    text = "<think>2+2 is 4</think><answer> 4 </answer>"
    assert extract_tag(text, "answer") == "4"
    assert extract_tag(text, "missing") is None
    assert strip_think(text) == "<answer> 4 </answer>"
    assert follows_think_answer(text)
    assert not follows_think_answer("4 <answer>4</answer>")
