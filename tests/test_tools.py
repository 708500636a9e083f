import asyncio
import threading
from typing import Literal

from reinforge.envs.tools import Tool


def add(a: int, b: int = 2) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b (int): The second addend.

    Returns:
        The sum.
    """
    return a + b


async def shout(text: str, mode: Literal["upper", "lower"] = "upper") -> str:
    """Change the case of text."""
    if not text:
        raise ValueError("nothing to shout")
    return text.upper() if mode == "upper" else text.lower()


def test_schema_comes_from_signature_and_docstring():
    schema = Tool(add).schema
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "add" and function["description"] == "Add two integers."
    params = function["parameters"]
    assert params["required"] == ["a"]
    assert params["properties"]["a"] == {"type": "integer", "description": "The first addend."}
    assert params["properties"]["b"]["default"] == 2
    assert Tool(shout).schema["function"]["parameters"]["properties"]["mode"]["enum"] == [
        "upper",
        "lower",
    ]


async def test_calls_validate_arguments_and_await_coroutines():
    assert (await Tool(add).call('{"a": 3}')).content == "5"
    assert (await Tool(shout).call({"text": "hi"})).content == "HI"


async def test_errors_are_results_for_the_model():
    bad_args = await Tool(add).call('{"a": "three"}')
    assert bad_args.error and "invalid arguments" in bad_args.content
    not_json = await Tool(add).call("{a: 1")
    assert not_json.error
    raised = await Tool(shout).call({"text": ""})
    assert raised.error and raised.content == "Error: ValueError: nothing to shout"

    def letters(word: str) -> set[str]:
        """The set of a word's letters: not a JSON value."""
        return set(word)

    not_a_value = await Tool(letters).call({"word": "aab"})
    assert not_a_value.error and "letters returned no JSON value" in not_a_value.content


async def test_an_episode_parameter_is_injected_and_hidden_from_the_model():
    from reinforge.envs import Episode
    from reinforge.types import Task

    def remember(note: str, episode: Episode) -> str:
        """Write a note into the episode."""
        episode.state.setdefault("notes", []).append(note)
        return "noted"

    tool = Tool(remember)
    assert list(tool.schema["function"]["parameters"]["properties"]) == ["note"]
    episode = Episode(Task(id="t", prompt=[]), [])
    assert (await tool.call({"note": "hi"}, episode)).content == "noted"
    assert episode.state["notes"] == ["hi"]


async def test_a_sync_tool_runs_in_a_thread_leaving_the_event_loop_free():
    looped = threading.Event()

    def wait_for_the_loop() -> str:
        """Wait until the event loop has run a callback: on the loop, it never would."""
        return "free" if looped.wait(timeout=30) else "blocked"

    asyncio.get_running_loop().call_soon(looped.set)
    assert (await Tool(wait_for_the_loop).call({})).content == "free"
