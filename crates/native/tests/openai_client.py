"""Drives a running `flint serve` with the real OpenAI client (the `openai` package from PyPI).

    python openai_client.py BASE_URL MODEL_ID [ALIAS...]

Run by tests/serve.rs with the interpreter of scripts/openai-client.sh. Each check raises on
failure (the test fails on a non-zero exit) and prints one line when it passes. Token counts
are kept small: lavapipe decodes about 10 tokens/s.
"""

import json
import sys
import threading
import time
import urllib.error
import urllib.request

import openai

BASE, MODEL, ALIASES = sys.argv[1], sys.argv[2], sys.argv[3:]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=300)
passed = 0


def ok(name):
    global passed
    passed += 1
    print(f"ok: {name}", flush=True)


def http(path, body=None):
    """A plain request (GET, or POST of raw bytes): (status, body text)."""
    request = urllib.request.Request(BASE + path, data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metrics():
    samples = {}
    for line in http("/metrics")[1].splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def wait_idle():
    deadline = time.time() + 120
    while True:
        m = metrics()
        if m["flint_running_sequences"] == 0 and m["flint_waiting_sequences"] == 0:
            return m
        assert time.time() < deadline, f"the engine did not go idle: {m}"
        time.sleep(0.05)


def chat_pair(question, results):
    """A chat question asked whole and streamed, at temperature 0."""
    messages = [{"role": "user", "content": question}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=10)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            temperature=0,
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    results[question] = (whole, chunks)


def check_models():
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL, *ALIASES], models
    # One model serves every request, whatever model it names; the answer names the model.
    for name in [*ALIASES, "some-other-model"]:
        answer = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hi"}], temperature=0, max_tokens=1
        )
        assert answer.model == MODEL, (name, answer)
    ok("/v1/models lists the served model and its aliases, and any model name is served by it")


def check_streamed_equals_whole():
    # Several clients at once: their requests share the engine's batches.
    questions = ["What is the capital of France?", "Name a primary color.", "What is 2 + 2?"]
    results = {}
    threads = [threading.Thread(target=chat_pair, args=(q, results)) for q in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted(questions), results.keys()
    for question, (whole, chunks) in results.items():
        answer = whole.choices[0].message.content
        assert answer, whole
        assert len({(c.id, c.created) for c in chunks}) == 1, "one id and time for the whole stream"
        content = [c for c in chunks if c.choices]
        assert content[0].choices[0].delta.role == "assistant", content[0]
        streamed = "".join(c.choices[0].delta.content or "" for c in content)
        assert streamed == answer, (question, streamed, answer)
        assert content[-1].choices[0].finish_reason == whole.choices[0].finish_reason, content[-1]
        assert all(c.choices[0].finish_reason is None for c in content[:-1])
        usage = chunks[-1].usage
        assert usage.completion_tokens == whole.usage.completion_tokens, (usage, whole.usage)
        assert usage.prompt_tokens == whole.usage.prompt_tokens > 0
    ok("chat: streamed pieces concatenate to the whole answer, three clients at once")

    prompt = "The capital of France is"
    whole = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=8, logprobs=2)
    choice = whole.choices[0]
    pieces = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=8, stream=True)
    assert "".join(c.choices[0].text for c in pieces) == choice.text, choice
    assert choice.text.startswith(" Paris"), choice.text
    assert len(choice.logprobs.tokens) == whole.usage.completion_tokens, choice.logprobs
    assert "".join(choice.logprobs.tokens) == choice.text, choice.logprobs.tokens
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs), choice.logprobs.top_logprobs
    ok("completions: streamed pieces concatenate to the whole text; logprobs per token")


def check_sampling_parameters():
    two = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, n=2, temperature=0.8, seed=7, stop=["\n\n"]
    )
    assert sorted(c.index for c in two.choices) == [0, 1], two
    again = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, n=2, temperature=0.8, seed=7, stop=["\n\n"]
    )
    assert [c.text for c in again.choices] == [c.text for c in two.choices], (two, again)
    banned = client.completions.create(
        model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=1, logit_bias={"7042": -100}
    )
    assert not banned.choices[0].text.startswith(" Paris"), banned
    ok("n, seed, stop and logit_bias reach the sampler")


def check_bad_requests():
    messages = [{"role": "user", "content": "hi"}]
    cases = [
        (dict(temperature=-1), "temperature"),
        (dict(top_p=0), "top_p"),
        (dict(max_tokens=100000), "max_tokens"),
        (dict(extra_body={"no_such_parameter": 1}), "no_such_parameter"),
        # SmolLM2's template renders no tools: the README says a request with tools is a 400.
        (dict(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
    ]
    for params, param in cases:
        kwargs = dict(model=MODEL, messages=messages, max_tokens=2)
        kwargs.update(params)
        try:
            client.chat.completions.create(**kwargs)
        except openai.BadRequestError as error:
            body = error.response.json()["error"]
            assert body["param"] == param, (params, body)
            assert set(body) == {"message", "type", "param", "code"}, body
        else:
            raise AssertionError(f"{params} was accepted")
    # With `tool_choice: none` the tools are not needed, and the request is served.
    no_call = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="none"
    )
    assert no_call.choices[0].message.tool_calls is None, no_call
    for body in [b"{", b"[1, 2]", b'{"messages": "hi"}']:
        status, text = http("/v1/chat/completions", body)
        assert status == 400, (body, status, text)
        assert json.loads(text)["error"]["type"] == "invalid_request_error", text
    status, text = http("/v1/completions", b" " * (2 << 20))
    assert status == 413, (status, text)
    assert "limit" in json.loads(text)["error"]["message"], text
    # The server goes on.
    after = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=2)
    assert after.usage.completion_tokens == 2, after
    assert http("/health") == (200, '{"status":"ok"}')
    ok("bad requests get 400 (413 for a huge body) with an OpenAI error object, and the server goes on")


def check_response_format():
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
        "additionalProperties": False,
    }
    messages = [{"role": "user", "content": "Is the sky blue? Answer in JSON."}]
    for seed in [None, 1, 2]:
        answer = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            temperature=0 if seed is None else 1,
            seed=seed,
            max_tokens=24,
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}},
        )
        choice = answer.choices[0]
        value = json.loads(choice.message.content)
        assert set(value) == {"answer", "sure"}, value
        assert value["answer"] in ("yes", "no") and isinstance(value["sure"], bool), value
        assert choice.finish_reason == "stop", choice
        if seed is None:
            greedy = choice.message.content
    streamed = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        temperature=0,
        max_tokens=24,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    )
    chunks = [chunk for chunk in streamed if chunk.choices]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text == greedy, (text, greedy)
    assert chunks[-1].choices[0].finish_reason == "stop", chunks[-1]
    # Any JSON object: a small model may write one longer than max_tokens, so it is checked
    # whole only when the model finished it.
    free = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give me a JSON object with your name."}],
        temperature=0,
        max_tokens=16,
        response_format={"type": "json_object"},
    ).choices[0]
    assert free.message.content.startswith("{"), free
    if free.finish_reason == "stop":
        assert isinstance(json.loads(free.message.content), dict), free
    for response_format in [
        {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "no-such-type"}}},
        {"type": "json_schema", "json_schema": {"schema": schema}},
        {"type": "xml"},
    ]:
        try:
            client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=4, response_format=response_format
            )
        except openai.BadRequestError as error:
            body = error.response.json()["error"]
            assert "response_format" in (body["param"] or ""), (response_format, body)
        else:
            raise AssertionError(f"{response_format} was accepted")
    ok("response_format: output valid against a JSON Schema, whole and streamed; JSON objects; bad formats get 400")


def check_disconnect_aborts():
    before = wait_idle()
    stream = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=300, stream=True, extra_body={"ignore_eos": True}
    )
    received = 0
    for chunk in stream:
        received += 1
        if received == 2:
            break
    assert metrics()["flint_running_sequences"] == 1
    stream.close()
    after = wait_idle()
    generated = after["flint_generated_tokens_total"] - before["flint_generated_tokens_total"]
    assert generated < 150, f"{generated} tokens generated: the request was not aborted"
    assert after['flint_kv_blocks{state="used"}'] == 0, after
    ok(f"a client that disconnects aborts its request ({generated:.0f} of 300 tokens generated)")


check_models()
check_streamed_equals_whole()
check_sampling_parameters()
check_bad_requests()
check_response_format()
check_disconnect_aborts()
print(f"openai client: all {passed} checks passed")
