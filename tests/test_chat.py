import json

import pytest

from reinforge.policy.chat import ChatFormat, TemplateError, parse_tool_calls
from reinforge.policy.models import load_tokenizer

CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Zürich", "days": 2}}\n</tool_call>'
USER = {"role": "user", "content": "Weather?"}


def sent_back(text: str) -> dict:
    """The assistant message an OpenAI client sends back for a reply whose tool calls the
    server parsed out of `text`: content beside the calls, not the markup."""
    parsed = parse_tool_calls(text)
    return {"role": "assistant", "content": parsed.content or None, "tool_calls": parsed.tool_calls}


def with_template(template: str) -> ChatFormat:
    tokenizer = load_tokenizer("tiny-random")
    tokenizer.chat_template = template
    return ChatFormat(tokenizer)


def test_continuation_equals_a_fresh_render_when_tokens_are_canonical(chat_format):
    # If the policy sampled exactly the canonical tokens of its reply (plus EOS), continuing
    # from tokens must give the same ids as rendering the whole conversation afresh.
    tokenizer = chat_format.tokenizer
    first = [{"role": "user", "content": "What is 2+2?"}]
    prompt = chat_format.prompt_ids(first)
    reply = tokenizer.encode("It is 4.", add_special_tokens=False) + [tokenizer.eos_token_id]
    later = [{"role": "user", "content": "And 3+3?"}]
    continued = chat_format.continuation_ids(prompt + reply, later, ended_with_eos=True)
    fresh = chat_format.prompt_ids([*first, {"role": "assistant", "content": "It is 4."}, *later])
    assert continued == fresh


def test_a_cut_turn_is_closed_by_template_tokens(chat_format):
    tokenizer = chat_format.tokenizer
    prompt = chat_format.prompt_ids([{"role": "user", "content": "Count"}])
    cut = tokenizer.encode("1, 2, 3", add_special_tokens=False)  # no EOS: max_tokens hit
    continued = chat_format.continuation_ids(
        prompt + cut, [{"role": "user", "content": "go on"}], ended_with_eos=False
    )
    tail = tokenizer.decode(continued[len(prompt) + len(cut) :])
    assert tail == "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"


def test_continuations_refuse_assistant_messages(chat_format):
    with pytest.raises(TemplateError):
        chat_format.continuation_ids([1], [{"role": "assistant", "content": "x"}], True)


def test_tools_go_into_the_system_prompt_for_templates_without_tool_support(chat_format):
    tool = {"type": "function", "function": {"name": "calc", "parameters": {}}}
    text = chat_format.render_text([{"role": "user", "content": "hi"}], [tool])
    assert text.startswith("<|im_start|>system\nYou may call tools.")
    assert '"name":"calc"' in text
    with_system = chat_format.render_text(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], [tool]
    )
    assert with_system.startswith("<|im_start|>system\nBe brief.\n\nYou may call tools.")


def test_parse_tool_calls():
    text = 'Let me compute.\n<tool_call>\n{"name": "calc", "arguments": {"x": 2}}\n</tool_call>'
    parsed = parse_tool_calls(text)
    assert parsed.content == "Let me compute." and parsed.errors == []
    (call,) = parsed.tool_calls
    assert call["function"]["name"] == "calc"
    assert json.loads(call["function"]["arguments"]) == {"x": 2}


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "f"',
    ],
)
def test_malformed_tool_calls_are_errors_not_calls(text):
    parsed = parse_tool_calls(text)
    assert parsed.tool_calls == [] and len(parsed.errors) == 1
    assert parsed.content == text


XML_CALL = (
    "<function=weather>\n<parameter=city>\nZürich\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n</function>"
)


def test_parse_xml_tool_calls():
    parsed = parse_tool_calls(f"Let me look.\n{XML_CALL}", "xml")
    assert parsed.content == "Let me look." and parsed.errors == []
    (call,) = parsed.tool_calls
    assert call["function"]["name"] == "weather"
    # values are text; the tool's argument types read the number from it
    assert json.loads(call["function"]["arguments"]) == {"city": "Zürich", "days": "2"}
    assert parse_tool_calls(XML_CALL).tool_calls == []  # not a Hermes call


@pytest.mark.parametrize(
    "text",
    [
        "<function=f>stray text</function>",
        "<function=>\n</function>",
        "<function=f><parameter=a>1</parameter><parameter=a>2</parameter></function>",
        "<function=f><parameter=a>1</parameter>",
    ],
)
def test_malformed_xml_tool_calls_are_errors_not_calls(text):
    parsed = parse_tool_calls(text, "xml")
    assert parsed.tool_calls == [] and len(parsed.errors) == 1
    assert parsed.content == text


@pytest.mark.parametrize(
    "text", [CALL, f"Let me look.\n{CALL}", f"{CALL}\n{CALL.replace('Zürich', 'Bern')}"]
)
def test_parsed_tool_calls_sent_back_render_as_the_text_that_was_sampled(chat_format, text):
    # Templates without tool support ignore `tool_calls`: the call would vanish from the
    # history. It comes back as the Hermes blocks it was parsed from, character for character.
    sampled = chat_format.render_text([USER, {"role": "assistant", "content": text}])
    assert chat_format.render_text([USER, sent_back(text)]) == sampled


def test_a_reply_that_keeps_its_markup_is_not_written_twice(chat_format):
    reply = {**sent_back(CALL), "content": CALL}  # how reinforge's own client sends it back
    assert chat_format.render_text([USER, reply]).count("<tool_call>") == 1


def test_tool_call_arguments_keep_their_characters(chat_format):
    (call,) = parse_tool_calls(CALL).tool_calls
    assert call["function"]["arguments"] == '{"city": "Zürich", "days": 2}'


TOOL_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}[{{ c.function.name }} {{ c.function.arguments | tojson }}]"
    "{% endfor %}</{{ m.role }}>{% endfor %}{% if tools %}{% endif %}"
)


def test_templates_with_tool_support_get_tool_calls_with_dict_arguments():
    chat = with_template(TOOL_TEMPLATE)
    assert chat.native_tools and chat.dict_arguments
    text = chat.render_text([USER, sent_back(CALL)])
    assert text.endswith('<assistant>[weather {"city": "Zürich", "days": 2}]</assistant>')


def test_templates_that_paste_arguments_get_the_string():
    chat = with_template(TOOL_TEMPLATE.replace(" | tojson", ""))
    assert chat.native_tools and not chat.dict_arguments
    text = chat.render_text([USER, sent_back(CALL)])
    assert text.endswith('<assistant>[weather {"city": "Zürich", "days": 2}]</assistant>')


def test_arguments_that_are_not_a_json_object_cannot_fill_a_dict_template():
    chat = with_template(TOOL_TEMPLATE)
    call = {"type": "function", "function": {"name": "f", "arguments": "[1]"}}
    with pytest.raises(TemplateError, match="JSON object"):
        chat.render_text([USER, {"role": "assistant", "content": None, "tool_calls": [call]}])
