"""Tool calling and embeddings through `flint serve`, driven by the real OpenAI client (the
`openai` package).

    python openai_tools.py BASE_URL MODEL_ID

Run by tests/serve.rs against tiny-qwen2-tools.gguf, a tiny random-weight model whose ChatML template
renders tools as Qwen2.5 does (tests/fixtures/chat_templates/chatml-tools.jinja). The model's
words are noise, so what is checked is what flint guarantees whatever the model: with
`required` or a named function, every answer is calls to offered functions with arguments
valid against their schemas; streamed deltas rebuild the whole answer; a tool's result can be
sent back; `none` never calls; embeddings are unit vectors, the same as floats and as base64.
(tests/tests/embeddings.rs checks their values against llama.cpp's.) Each check raises on failure
and prints one line when it passes.
"""

import base64
import json
import math
import struct
import sys

import openai

BASE, MODEL = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=300)
passed = 0

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time now in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def ok(name):
    global passed
    passed += 1
    print(f"ok: {name}", flush=True)


def check_arguments(name, arguments):
    """`arguments` (JSON text) is valid against the schema of the offered function `name`."""
    values = json.loads(arguments)
    assert isinstance(values, dict), arguments
    if name == "get_weather":
        assert set(values) == {"city", "unit"}, arguments
        assert isinstance(values["city"], str) and len(values["city"]) <= 12, arguments
        assert values["unit"] in ("celsius", "fahrenheit"), arguments
    elif name == "get_time":
        assert set(values) == {"zone"}, arguments
        assert isinstance(values["zone"], int) and -12 <= values["zone"] <= 14, arguments
    else:
        raise AssertionError(f"a call to '{name}', which was not offered")


def check_calls(choice, names=("get_weather", "get_time"), most=None):
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls, choice
    assert most is None or len(calls) <= most, calls
    for call in calls:
        assert call.type == "function" and call.id, call
        assert call.function.name in names, call
        check_arguments(call.function.name, call.function.arguments)
    assert len({call.id for call in calls}) == len(calls), calls
    return calls


def streamed(**request):
    """A streamed answer's one choice rebuilt from its deltas: (content, calls, finish_reason),
    calls as [id, name, arguments] lists."""
    content, calls, finish = "", [], None
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                if call.index == len(calls):
                    assert call.id and call.type == "function" and call.function.name, call
                    calls.append([call.id, call.function.name, ""])
                assert call.index < len(calls), call
                calls[call.index][2] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, calls, finish


def check_required():
    for temperature, seeds in [(0, [None]), (1, [1, 2, 3])]:
        for seed in seeds:
            answer = client.chat.completions.create(
                model=MODEL,
                messages=QUESTION,
                tools=TOOLS,
                tool_choice="required",
                temperature=temperature,
                seed=seed,
                max_tokens=200,
            )
            check_calls(answer.choices[0])
    ok("'required' always calls an offered function with valid arguments (temperature 0, and 1 with 3 seeds)")


def check_named():
    for temperature, seed in [(0, None), (1, 4), (1, 5)]:
        answer = client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            temperature=temperature,
            seed=seed,
            max_tokens=200,
        )
        check_calls(answer.choices[0], names=("get_time",))
    ok("a named function is the one called")


def check_single_call():
    for seed in [6, 7]:
        answer = client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1,
            seed=seed,
            max_tokens=200,
        )
        check_calls(answer.choices[0], most=1)
    ok("parallel_tool_calls false makes one call")


def check_streamed():
    request = dict(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice="required", temperature=1, seed=8, max_tokens=200)
    whole = client.chat.completions.create(**request).choices[0]
    calls = check_calls(whole)
    content, streamed_calls, finish = streamed(**request)
    assert finish == "tool_calls", finish
    assert content == (whole.message.content or ""), (content, whole.message.content)
    assert [(name, arguments) for _, name, arguments in streamed_calls] == [
        (call.function.name, call.function.arguments) for call in calls
    ], (streamed_calls, calls)
    ok("streamed tool_calls deltas rebuild the whole answer's calls")


def check_two_turns():
    first = client.chat.completions.create(
        model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=200
    )
    calls = check_calls(first.choices[0])
    history = QUESTION + [
        {
            "role": "assistant",
            "content": first.choices[0].message.content,
            "tool_calls": [call.model_dump() for call in calls],
        }
    ]
    history += [{"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'} for call in calls]
    answer = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=8
    )
    choice = answer.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length"), choice
    assert isinstance(choice.message.content, str), choice
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens, (answer.usage, first.usage)
    ok("a call, its result and the answer after it make a conversation")


def check_none_and_auto():
    for seed in [9, 10]:
        answer = client.chat.completions.create(
            model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice="none", temperature=1, seed=seed, max_tokens=24
        )
        choice = answer.choices[0]
        assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length"), choice
    # `auto` lets the model choose; whichever it chooses, a finished call is a valid one.
    answer = client.chat.completions.create(
        model=MODEL, messages=QUESTION, tools=TOOLS, temperature=1, seed=11, max_tokens=48
    )
    choice = answer.choices[0]
    if choice.finish_reason == "tool_calls":
        check_calls(choice)
    ok("'none' never calls, and 'auto' answers")


def check_errors():
    cases = [
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
        (dict(tools=[WEATHER, WEATHER]), "tools"),
        (dict(tools=TOOLS, response_format={"type": "json_object"}), "response_format"),
        (dict(tool_choice="required"), "tool_choice"),
        # A schema llguidance cannot compile is refused naming the tools, not response_format.
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "no-such-type"}}}], tool_choice="required"), "tools"),
    ]
    for fields, param in cases:
        try:
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=1, **fields)
        except openai.BadRequestError as error:
            assert error.body["param"] == param, error.body
        else:
            raise AssertionError(f"{fields} was accepted")
    ok("bad tool requests are 400s naming the field")


def check_embeddings():
    texts = ["the cat sat on the mat", "Hello, world!", "the cat sat on the mat"]
    answer = client.embeddings.create(model=MODEL, input=texts)
    vectors = [item.embedding for item in answer.data]
    assert [item.index for item in answer.data] == [0, 1, 2], answer
    assert all(len(vector) == 256 for vector in vectors), [len(vector) for vector in vectors]
    for vector in vectors:
        assert abs(math.sqrt(sum(value * value for value in vector)) - 1) < 1e-5, "unit length"
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1], "the same text, the same vector"
    assert answer.usage.prompt_tokens > 0 and answer.usage.total_tokens == answer.usage.prompt_tokens, answer.usage
    # base64: the same vectors as little-endian f32 (the client decodes it when it asked for it).
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=texts[:1], encoding_format="base64")
    encoded = json.loads(raw.text)["data"][0]["embedding"]
    decoded = list(struct.unpack(f"<{len(vectors[0])}f", base64.b64decode(encoded)))
    assert decoded == vectors[0], "base64 and float give the same vector"
    ids = client.embeddings.create(model=MODEL, input=[[116, 104, 101]]).data[0].embedding
    assert len(ids) == 256
    try:
        client.embeddings.create(model=MODEL, input="x", dimensions=8)
    except openai.BadRequestError as error:
        assert error.body["param"] == "dimensions", error.body
    else:
        raise AssertionError("dimensions was accepted")
    ok("/v1/embeddings: unit vectors per input, float and base64 alike, ids too; dimensions is a 400")


for check in [check_embeddings, check_required, check_named, check_single_call, check_streamed, check_two_turns, check_none_and_auto, check_errors]:
    check()
print(f"{passed} checks passed")
