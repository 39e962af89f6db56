// Tool-calling checks for any OpenAI-shaped chat API: the `openai` npm client against
// `flint serve` (openai-node.mjs) and the web package's `engine.chat.completions.create` in
// headless Chromium, page and worker (browser.test.mjs). No imports, so the page can load it.
//
// The model is tiny-qwen2-tools.gguf, a tiny random-weight one whose ChatML template renders
// tools (tests/fixtures/chat_templates/chatml-tools.jinja): its words are noise, so what is checked
// is what flint guarantees whatever the model. With 'required' or a named function every answer
// is calls to offered functions, with arguments valid against their schemas, at temperature 0
// and 1; streamed tool_calls deltas rebuild the whole answer; a call's result can be sent back
// and answered; 'none' never calls; a bad request is an error naming its field.

export const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city now.',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['celsius', 'fahrenheit'] } },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};
export const time = {
  type: 'function',
  function: {
    name: 'get_time',
    description: 'The time now in a time zone.',
    parameters: {
      type: 'object',
      properties: { zone: { type: 'integer', minimum: -12, maximum: 14 } },
      required: ['zone'],
      additionalProperties: false,
    },
  },
};
const tools = [weather, time];
const question = [{ role: 'user', content: 'What is the weather in Paris?' }];

function check(condition, what) {
  if (!condition) throw new Error(`check failed: ${what}`);
}

/** `args` (JSON text) is valid against the schema of the offered function `name`. */
function checkArguments(name, args) {
  const values = JSON.parse(args);
  const keys = Object.keys(values).sort().join();
  if (name === 'get_weather') {
    check(keys === 'city,unit', `get_weather's arguments ${args}`);
    check(typeof values.city === 'string' && [...values.city].length <= 12, `city in ${args}`);
    check(['celsius', 'fahrenheit'].includes(values.unit), `unit in ${args}`);
  } else if (name === 'get_time') {
    check(keys === 'zone', `get_time's arguments ${args}`);
    check(Number.isInteger(values.zone) && values.zone >= -12 && values.zone <= 14, `zone in ${args}`);
  } else {
    check(false, `a call to '${name}', which was not offered`);
  }
}

function checkCalls(choice, names = ['get_weather', 'get_time']) {
  const shown = JSON.stringify(choice);
  check(choice.finish_reason === 'tool_calls', `finish_reason tool_calls: ${shown}`);
  const calls = choice.message.tool_calls;
  check(calls?.length > 0, `calls: ${shown}`);
  for (const call of calls) {
    check(call.type === 'function' && call.id, `a call's id and type: ${shown}`);
    check(names.includes(call.function.name), `an offered name: ${shown}`);
    checkArguments(call.function.name, call.function.arguments);
  }
  check(new Set(calls.map((call) => call.id)).size === calls.length, `distinct ids: ${shown}`);
  return calls;
}

/**
 * Runs every check with `create(request)`, which answers an OpenAI chat request (a promise of
 * the response, or with `stream: true` of an async iterable of chunks); `fieldOf(error)` is the
 * field a refused request's error names. Returns the names of the checks passed.
 */
export async function runToolChecks(create, fieldOf) {
  const passed = [];
  const ask = (request) => create({ messages: question, max_tokens: 200, ...request });

  for (const [temperature, seed] of [[0, undefined], [1, 1], [1, 2], [1, 3]]) {
    checkCalls((await ask({ tools, tool_choice: 'required', temperature, seed })).choices[0]);
  }
  passed.push("'required' calls an offered function with valid arguments (temperature 0, and 1 with 3 seeds)");

  for (const [temperature, seed] of [[0, undefined], [1, 4]]) {
    const named = { type: 'function', function: { name: 'get_time' } };
    checkCalls((await ask({ tools, tool_choice: named, temperature, seed })).choices[0], ['get_time']);
  }
  passed.push('a named function is the one called');

  for (const seed of [6, 7]) {
    const choice = (await ask({ tools, tool_choice: 'required', parallel_tool_calls: false, temperature: 1, seed })).choices[0];
    check(checkCalls(choice).length === 1, `one call: ${JSON.stringify(choice)}`);
  }
  passed.push('parallel_tool_calls false makes one call');

  {
    const request = { tools, tool_choice: 'required', temperature: 1, seed: 8 };
    const whole = (await ask(request)).choices[0];
    const calls = checkCalls(whole);
    let content = '';
    let finish = null;
    const streamed = [];
    for await (const chunk of await ask({ ...request, stream: true })) {
      for (const choice of chunk.choices) {
        content += choice.delta.content ?? '';
        for (const call of choice.delta.tool_calls ?? []) {
          if (call.index === streamed.length) {
            check(call.id && call.type === 'function' && call.function.name, `a call's first delta: ${JSON.stringify(call)}`);
            streamed.push({ name: call.function.name, arguments: '' });
          }
          streamed[call.index].arguments += call.function.arguments ?? '';
        }
        finish = choice.finish_reason ?? finish;
      }
    }
    check(finish === 'tool_calls', `the stream's finish_reason ${finish}`);
    check(content === (whole.message.content ?? ''), `streamed content ${JSON.stringify(content)}`);
    const expected = calls.map((call) => ({ name: call.function.name, arguments: call.function.arguments }));
    check(JSON.stringify(streamed) === JSON.stringify(expected), `streamed ${JSON.stringify(streamed)} vs ${JSON.stringify(expected)}`);
  }
  passed.push("streamed tool_calls deltas rebuild the whole answer's calls");

  {
    const first = await ask({ tools, tool_choice: 'required', temperature: 0 });
    const calls = checkCalls(first.choices[0]);
    const messages = [
      ...question,
      { role: 'assistant', content: first.choices[0].message.content, tool_calls: calls },
      ...calls.map((call) => ({ role: 'tool', tool_call_id: call.id, content: '{"temperature": 21}' })),
    ];
    const answer = await ask({ messages, tools, tool_choice: 'none', temperature: 0, max_tokens: 8 });
    const choice = answer.choices[0];
    check(!choice.message.tool_calls && ['stop', 'length'].includes(choice.finish_reason), `an answer: ${JSON.stringify(choice)}`);
    check(answer.usage.prompt_tokens > first.usage.prompt_tokens, 'the second turn holds the first');
  }
  passed.push('a call, its result and the answer after it make a conversation');

  for (const seed of [9, 10]) {
    const choice = (await ask({ tools, tool_choice: 'none', temperature: 1, seed, max_tokens: 24 })).choices[0];
    check(!choice.message.tool_calls && ['stop', 'length'].includes(choice.finish_reason), `no call: ${JSON.stringify(choice)}`);
  }
  passed.push("'none' never calls");

  const refusals = [
    [{ tools, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
    [{ tools: [weather, weather] }, 'tools'],
    [{ tools, response_format: { type: 'json_object' } }, 'response_format'],
  ];
  for (const [fields, field] of refusals) {
    let refused;
    try {
      await ask({ ...fields, max_tokens: 1 });
    } catch (error) {
      refused = fieldOf(error);
    }
    check(refused === field, `${JSON.stringify(fields)} refused naming ${refused}, not ${field}`);
  }
  passed.push('bad tool requests are refused naming the field');
  return passed;
}
