// The web package in a real browser: headless Chromium (Debian's `chromium`, driven by
// playwright-core) with its own WebGPU (SwiftShader: subgroups, no shader-f16), the package
// and SmolLM2 served from localhost by a small server in this file. Run by
// scripts/test-web.sh, which builds the package and the native `flint` first.
//
// Checks: the WebGPU adapter comes up; the `npm pack` tarball installs in a separate project,
// its `exports` resolve and its module runs in the page; a model loads from a URL with progress
// by stage (download, then upload); greedy output for llama.cpp's reference prompts equals
// native flint's token for token; streamed items concatenate to the non-streamed output; the
// OpenAI chat shapes (whole and streamed); output constrained by a JSON Schema
// (`response_format`); tool calls (tool-checks.mjs, on a tiny model, in the page and a worker); a bad parameter is an Error naming it and the engine keeps working; an
// AbortSignal ends a request with finish_reason abort, frees its KV blocks, and the next
// request still works; loading from a Blob, an ArrayBuffer and a URL without the cache;
// inspectGguf; a missing URL or a file that is not GGUF is an Error; a second load of a URL
// from the Cache API without a request; the same API with the engine in a Web Worker; the demo
// page answers (its screenshot is saved in FLINT_WEB_ARTIFACTS); unload. A model larger than
// the page should hold: large-model.test.mjs.
//
// Environment: FLINT_BIN (the native `flint`, default target/debug/flint), FLINT_MODEL_DIR,
// FLINT_REFERENCE_DIR (as the Rust end-to-end tests read them), FLINT_WEB_TOKENS (tokens per
// greedy comparison, default 8), FLINT_WEB_ARTIFACTS (where the demo's screenshot and, on
// failure, the pages' console log go; default target/web-test).
//
// The server and the browser's flags are in harness.mjs.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { env, launchChromium, modelPath, repoDir, requireFiles, serve, tinyEmbeddingModelPath, tinyModelPath, webDir } from './harness.mjs';

const referenceDir = env('FLINT_REFERENCE_DIR') ?? path.join(repoDir, 'tests', 'reference');
const flintBin = env('FLINT_BIN') ?? path.join(repoDir, 'target', 'debug', 'flint');
const tokens = Number(env('FLINT_WEB_TOKENS') ?? 8);
const artifactsDir = env('FLINT_WEB_ARTIFACTS') ?? path.join(repoDir, 'target', 'web-test');

requireFiles('browser tests', [
  ['the model', modelPath, 'run scripts/fetch-models.sh'],
  ['the tiny model of the tool-call checks', tinyModelPath, 'run scripts/fixtures/make_tiny_models.sh'],
  ['the tiny model of the embedding checks', tinyEmbeddingModelPath, 'run scripts/fixtures/make_tiny_models.sh'],
  ['the reference data', path.join(referenceDir, 'smollm2-135m-q4_1', 'greedy.json'), 'set FLINT_REFERENCE_DIR'],
  ['the native flint', flintBin, 'run scripts/test-web.sh, which builds it, or set FLINT_BIN'],
  ['the package', path.join(webDir, 'pkg', 'flint_web_bg.wasm'), 'run scripts/build-web.sh'],
]);

const cases = JSON.parse(readFileSync(path.join(referenceDir, 'smollm2-135m-q4_1', 'greedy.json'), 'utf8'));

// ---- native flint's greedy tokens -------------------------------------------------------------

function nativeGreedy(prompt) {
  const stdout = execFileSync(
    flintBin,
    ['generate', '--model', modelPath, '--prompt', prompt, '--temperature', '0', '--max-tokens', String(tokens), '--json'],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] },
  );
  return JSON.parse(stdout);
}

// ---- the package as a project installs it --------------------------------------------------

// `npm pack` makes the tarball; a separate project installs it, Node resolves its `exports`
// there, and the server below serves the installed copy to the page at /installed/.
const packDir = mkdtempSync(path.join(os.tmpdir(), 'flint-pack-'));
const tarball = path.join(packDir, execFileSync('npm', ['pack', '--silent', '--pack-destination', packDir], { cwd: webDir, encoding: 'utf8' }).trim().split('\n').at(-1));
const projectDir = path.join(packDir, 'project');
mkdirSync(projectDir);
writeFileSync(path.join(projectDir, 'package.json'), JSON.stringify({ name: 'flint-web-consumer', private: true, type: 'module' }));
execFileSync('npm', ['install', '--offline', '--no-audit', '--no-fund', '--silent', tarball], { cwd: projectDir, stdio: 'inherit' });
const installedDir = path.join(projectDir, 'node_modules', 'flint-web');
const installedExports = JSON.parse(
  execFileSync('node', ['--input-type=module', '-e', "import * as flint from 'flint-web'; console.log(JSON.stringify(Object.keys(flint).sort()))"], { cwd: projectDir, encoding: 'utf8' }),
);

// ---- the server ---------------------------------------------------------------------------

// The installed copy of the package, for the page at /installed/; the tool-call checks' tiny
// model and template.
const toolsTemplatePath = path.join(repoDir, 'tests', 'fixtures', 'chat_templates', 'chatml-tools.jinja');
const { origin, requests, close: closeServer } = await serve((pathname) => {
  if (pathname === '/tiny.gguf') return tinyModelPath;
  if (pathname === '/tiny-embedding.gguf') return tinyEmbeddingModelPath;
  if (pathname === '/chatml-tools.jinja') return toolsTemplatePath;
  return /^\/installed\/(js|pkg)\/[\w.-]+$/.test(pathname) ? path.join(installedDir, pathname.slice('/installed/'.length)) : undefined;
});

// ---- the browser ---------------------------------------------------------------------------

const { context, close: closeBrowser } = await launchChromium();
const page = context.pages()[0] ?? (await context.newPage());
const consoleLog = [];
page.on('console', (message) => consoleLog.push(`[${message.type()}] ${message.text()}`));
page.on('pageerror', (error) => consoleLog.push(`[pageerror] ${error.stack ?? error}`));

let failures = 0;
const started = Date.now();

async function test(name, body) {
  const t0 = Date.now();
  try {
    const detail = await body();
    console.log(`ok   ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)${detail ? `: ${detail}` : ''}`);
  } catch (error) {
    failures += 1;
    console.log(`FAIL ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s): ${error.stack ?? error}`);
  }
}

/** Runs `body` in the page (where `window.flint` is the package and `window.engine` the engine). */
const inPage = (body, arg) => page.evaluate(body, arg);

/**
 * A load's progress calls (`[loaded, total, stage]`) by stage, checked against the contract of
 * `onProgress`: the stages are `expected` in that order, each counts up and ends at its total.
 */
function progressStages(calls, expected) {
  const stages = {};
  for (const [loaded, total, stage] of calls) {
    (stages[stage] ??= []).push([loaded, total]);
  }
  assert.deepEqual(Object.keys(stages), expected, 'the stages of the progress calls');
  const order = calls.map(([, , stage]) => expected.indexOf(stage));
  assert.ok(order.every((stage, i) => i === 0 || stage >= order[i - 1]), 'a stage came back after the next began');
  for (const [stage, stageCalls] of Object.entries(stages)) {
    assert.ok(stageCalls.every(([loaded], i) => i === 0 || loaded >= stageCalls[i - 1][0]), `${stage} progress went backwards`);
    const [loaded, total] = stageCalls.at(-1);
    assert.equal(loaded, total, `the ${stage} stage ended at ${loaded} of ${total}`);
  }
  return stages;
}

try {
  await page.goto(`${origin}/tests/page.html`);
  await page.waitForFunction(() => window.flint !== undefined, null, { timeout: 30_000 });

  await test('WebGPU adapter in headless Chromium', async () => {
    const adapter = await inPage(async () => {
      const adapter = await navigator.gpu?.requestAdapter();
      const info = adapter?.info;
      return adapter ? { vendor: info.vendor, architecture: info.architecture, features: [...adapter.features] } : null;
    });
    assert.ok(adapter, 'navigator.gpu.requestAdapter() gave null');
    return `${adapter.vendor} ${adapter.architecture}, subgroups: ${adapter.features.includes('subgroups')}, shader-f16: ${adapter.features.includes('shader-f16')}`;
  });

  await test('the npm pack tarball installs, and its module works in the page', async () => {
    const expected = ['Engine', 'WorkerEngine', 'cachedModels', 'deleteCachedModel', 'gpuInfo', 'init', 'inspectGguf'];
    assert.deepEqual(installedExports, expected);
    const device = await inPage(async () => (await (await import('/installed/js/flint.js')).gpuInfo(0)).device);
    assert.equal(device.backend, 'BrowserWebGpu');
    return `${path.basename(tarball)}: ${installedExports.join(', ')}`;
  });

  await test('Engine.load from a URL, with progress', async () => {
    const { progress, info } = await inPage(async () => {
      const progress = [];
      window.engine = await window.flint.Engine.load('/model.gguf', {
        kvCacheTokens: 1024,
        onProgress: (loaded, total, stage) => progress.push([loaded, total, stage]),
      });
      return { progress, info: window.engine.info() };
    });
    const size = statSync(modelPath).size;
    const { download, upload } = progressStages(progress, ['download', 'upload']);
    assert.ok(download.length > 2, `the download stage had ${download.length} calls`);
    assert.deepEqual(download[0], [0, size]);
    assert.deepEqual(download.at(-1), [size, size]);
    assert.ok(upload.length > 2, `the upload stage had ${upload.length} calls`);
    assert.ok(upload.at(-1)[1] <= size, `${upload.at(-1)[1]} bytes uploaded of a ${size}-byte file`);
    assert.equal(info.device.backend, 'BrowserWebGpu');
    return `${info.model} (${info.architecture}) on ${info.device.adapter || 'the browser adapter'}, ${download.length} download and ${upload.length} upload progress calls`;
  });

  const greedy = [];
  await test(`greedy output equals native flint's, ${tokens} tokens for each of ${cases.length} prompts`, async () => {
    const lines = [];
    for (const { prompt } of cases) {
      const native = nativeGreedy(prompt);
      const web = await inPage(([prompt, tokens]) => window.engine.generate(prompt, { temperature: 0, max_new_tokens: tokens }), [prompt, tokens]);
      greedy.push({ prompt, web });
      assert.deepEqual(web.output_ids, native.output_ids, `${JSON.stringify(prompt)}: browser ids (actual) differ from native flint's (expected)`);
      assert.equal(web.text, native.text);
      assert.equal(web.meta_info.prompt_tokens, native.meta_info.prompt_tokens);
      assert.deepEqual(web.meta_info.finish_reason, native.meta_info.finish_reason);
      const seconds = web.meta_info.e2e_latency;
      lines.push(`${JSON.stringify(prompt)} -> ${JSON.stringify(web.text)} [${web.output_ids.join(' ')}] (${(web.output_ids.length / seconds).toFixed(1)} tokens/s end to end)`);
    }
    return `\n       ${lines.join('\n       ')}`;
  });

  await test('streamed items concatenate to the non-streamed output', async () => {
    const { prompt, web } = greedy[0] ?? assert.fail('no greedy output to compare with');
    const items = await inPage(async ([prompt, tokens]) => {
      const items = [];
      for await (const item of window.engine.stream(prompt, { temperature: 0, max_new_tokens: tokens })) {
        items.push(item);
      }
      return items;
    }, [prompt, tokens]);
    assert.ok(items.length > 1, `${items.length} items`);
    assert.equal(items.map((item) => item.text).join(''), web.text);
    assert.deepEqual(items.flatMap((item) => item.output_ids), web.output_ids);
    assert.ok(items.slice(0, -1).every((item) => item.meta_info.finish_reason === null), 'a finish reason before the last item');
    assert.deepEqual(items.at(-1).meta_info.finish_reason, web.meta_info.finish_reason);
    return `${items.length} items`;
  });

  await test('chat.completions.create: the response and the streamed chunks', async () => {
    const { response, chunks } = await inPage(async (tokens) => {
      const body = { messages: [{ role: 'user', content: 'What is the capital of France?' }], temperature: 0, max_tokens: tokens };
      const response = await window.engine.chat.completions.create(body);
      const chunks = [];
      for await (const chunk of await window.engine.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } })) {
        chunks.push(chunk);
      }
      return { response, chunks };
    }, tokens);
    assert.equal(response.object, 'chat.completion');
    assert.match(response.id, /^chatcmpl-/);
    const [choice] = response.choices;
    assert.equal(choice.message.role, 'assistant');
    assert.ok(choice.message.content.length > 0, 'an empty answer');
    assert.ok(['stop', 'length'].includes(choice.finish_reason), choice.finish_reason);
    assert.equal(response.usage.total_tokens, response.usage.prompt_tokens + response.usage.completion_tokens);

    const usage = chunks.at(-1);
    assert.deepEqual(usage.choices, []);
    assert.deepEqual(usage.usage.completion_tokens, response.usage.completion_tokens);
    const deltas = chunks.slice(0, -1);
    assert.ok(deltas.every((chunk) => chunk.object === 'chat.completion.chunk' && chunk.id === deltas[0].id));
    assert.equal(deltas[0].choices[0].delta.role, 'assistant');
    assert.equal(deltas.map((chunk) => chunk.choices[0].delta.content).join(''), choice.message.content);
    assert.equal(deltas.at(-1).choices[0].finish_reason, choice.finish_reason);
    return `${JSON.stringify(choice.message.content)} in ${deltas.length} chunks`;
  });

  await test('chat.completions.create with a strict json_schema response_format; a bad schema is an Error naming it', async () => {
    const { response, badSchema } = await inPage(async () => {
      const engine = window.engine;
      const messages = [{ role: 'user', content: 'Is Paris the capital of France? Answer yes or no.' }];
      // The whole answer is a few tokens ("yes" in quotes), so SwiftShader's decode stays short.
      const json_schema = { name: 'answer', schema: { type: 'string', enum: ['yes', 'no'] }, strict: true };
      const response = await engine.chat.completions.create({
        messages,
        temperature: 0,
        max_tokens: 8,
        response_format: { type: 'json_schema', json_schema },
      });
      let badSchema;
      try {
        await engine.chat.completions.create({
          messages,
          max_tokens: 4,
          response_format: { type: 'json_schema', json_schema: { name: 'bad', schema: { type: 'no-such-type' } } },
        });
        badSchema = 'no error';
      } catch (error) {
        badSchema = `${error instanceof Error ? 'Error' : typeof error}: ${error.message}`;
      }
      return { response, badSchema };
    });
    const [choice] = response.choices;
    const answer = JSON.parse(choice.message.content);
    assert.ok(['yes', 'no'].includes(answer), `${JSON.stringify(answer)} is not in the schema's enum`);
    assert.equal(choice.finish_reason, 'stop');
    assert.match(badSchema, /^Error: .*'response_format'/);
    return `${choice.message.content} in ${response.usage.completion_tokens} tokens; ${badSchema}`;
  });

  await test('tool calls through chat.completions.create in the page and in a worker (tool-checks.mjs)', async () => {
    const passed = await inPage(async () => {
      const { runToolChecks } = await import('/tests/tool-checks.mjs');
      const chatTemplate = await (await fetch('/chatml-tools.jinja')).text();
      const fieldOf = (error) => /^invalid '(\w+)'/.exec(error.message)?.[1] ?? error.message;
      const passed = {};
      // The worker's engine gets the model's own template as the `chatTemplate` option.
      const engines = [['page', window.flint.Engine, {}], ['worker', window.flint.WorkerEngine, { chatTemplate }]];
      for (const [where, Engine, options] of engines) {
        const engine = await Engine.load('/tiny.gguf', { ...options, cache: false, kvCacheTokens: 2048 });
        try {
          passed[where] = await runToolChecks((request) => engine.chat.completions.create(request), fieldOf);
        } finally {
          await engine.unload();
        }
      }
      return passed;
    });
    assert.deepEqual(passed.worker, passed.page);
    return `${passed.page.length} checks passed in each: ${passed.page.join('; ')}`;
  });

  await test("embeddings.create in the page and in a worker equals llama.cpp's (embeddings.json)", async () => {
    const fixture = JSON.parse(readFileSync(path.join(repoDir, 'tests', 'fixtures', 'tiny_models', 'embeddings.json'), 'utf8'));
    const record = fixture.models.find((model) => model.model_file === path.basename(tinyEmbeddingModelPath));
    const inputs = record.inputs.map((input) => input.ids);
    const got = await inPage(async (inputs) => {
      const got = {};
      for (const [where, Engine] of [['page', window.flint.Engine], ['worker', window.flint.WorkerEngine]]) {
        const engine = await Engine.load('/tiny-embedding.gguf', { cache: false, kvCacheTokens: 512 });
        try {
          const floats = await engine.embeddings.create({ input: inputs });
          const base64 = await engine.embeddings.create({ input: inputs[0], encoding_format: 'base64' });
          got[where] = { vectors: floats.data.map((item) => item.embedding), base64: base64.data[0].embedding, usage: floats.usage };
        } finally {
          await engine.unload();
        }
      }
      return got;
    }, inputs);
    const details = [];
    for (const where of ['page', 'worker']) {
      const { vectors, base64, usage } = got[where];
      assert.equal(usage.prompt_tokens, inputs.flat().length);
      // The bound of tests/tests/embeddings.rs for mean pooling: llama.cpp rounds matmul inputs to 8 bits.
      for (const [index, vector] of vectors.entries()) {
        const expected = record.inputs[index].embedding;
        const worst = Math.max(...vector.map((value, i) => Math.abs(value - expected[i])));
        const cosine = vector.reduce((sum, value, i) => sum + value * expected[i], 0);
        assert.ok(worst <= 2e-3 && cosine > 0.9999, `${where} input ${index}: cosine ${cosine}, worst ${worst}`);
        details.push(cosine.toFixed(6));
      }
      const decoded = Array.from(new Float32Array(Uint8Array.from(Buffer.from(base64, 'base64')).buffer));
      assert.deepEqual(decoded, vectors[0]);
    }
    return `cosines with llama.cpp ${details.join(', ')}`;
  });

  await test('a bad parameter is an Error naming it, and the engine keeps working', async () => {
    const results = await inPage(async () => {
      const engine = window.engine;
      const error = window.errorOf;
      return {
        temperature: await error(() => engine.generate('Hi', { temperature: -1 })),
        topP: await error(async () => {
          for await (const _ of engine.stream('Hi', { top_p: 0 }));
        }),
        unknown: await error(() => engine.generate('Hi', { temprature: 0 })),
        type: await error(() => engine.generate('Hi', { max_new_tokens: 'many' })),
        chat: await error(() => engine.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], temperature: -1 })),
        after: await engine.generate('Hi', { temperature: 0, max_new_tokens: 2 }),
      };
    });
    assert.match(results.temperature, /^Error: .*'temperature'/);
    assert.match(results.topP, /^Error: .*'top_p'/);
    assert.match(results.unknown, /^Error: .*temprature/);
    assert.match(results.type, /^Error: .*'max_new_tokens'/);
    assert.match(results.chat, /^Error: .*'temperature'/);
    assert.equal(results.after.output_ids.length, 2);
    return results.temperature;
  });

  await test('an AbortSignal ends a request with finish_reason abort, frees its KV blocks, and the next works', async () => {
    const result = await inPage(async (tokens) => {
      const engine = window.engine;
      const controller = new AbortController();
      const items = [];
      for await (const item of engine.stream('Once upon a time', { temperature: 0, max_new_tokens: 500, ignore_eos: true, signal: controller.signal })) {
        items.push(item);
        if (items.length === 3) {
          controller.abort();
        }
      }
      // The step loop publishes its metrics after the step that retired the sequence.
      await new Promise((resolve) => setTimeout(resolve, 50));
      const metrics = engine.metrics();
      const late = new AbortController();
      const pending = engine.generate('Once upon a time', { temperature: 0, max_new_tokens: 500, ignore_eos: true, signal: late.signal });
      setTimeout(() => late.abort(), 300);
      const whole = await pending;
      const already = await engine.generate('Hi', { max_new_tokens: 50, signal: AbortSignal.abort() });
      const next = await engine.generate('The capital of France is', { temperature: 0, max_new_tokens: 4 });
      return { items, metrics, whole, already, next };
    }, tokens);
    const last = result.items.at(-1);
    assert.deepEqual(last.meta_info.finish_reason, { type: 'abort' });
    assert.ok(result.items.length < 10, `${result.items.length} items after the abort at the third`);
    assert.equal(result.metrics.running_sequences, 0);
    assert.equal(result.metrics.kv_blocks_used, 0, 'KV blocks still used after the abort');
    assert.deepEqual(result.whole.meta_info.finish_reason, { type: 'abort' });
    assert.ok(result.whole.output_ids.length < 500);
    assert.deepEqual(result.already.meta_info.finish_reason, { type: 'abort' });
    const reference = greedy.find((g) => g.prompt === 'The capital of France is');
    assert.ok(reference, 'no greedy output for the prompt to compare with');
    assert.deepEqual(result.next.output_ids, reference.web.output_ids.slice(0, 4));
    return `stream aborted after ${result.items.length} items, generate after ${result.whole.output_ids.length} tokens`;
  });

  await test('Engine.load from a Blob, an ArrayBuffer, a URL without the cache; inspectGguf; a missing URL or a file that is not GGUF is an Error', async () => {
    const result = await inPage(async () => {
      const { Engine, cachedModels, inspectGguf } = window.flint;
      const error = window.errorOf;
      const prompt = 'The capital of France is';
      const blob = await (await fetch('/model.gguf')).blob();
      const blobProgress = [];
      const fromBlob = await Engine.load(blob, { kvCacheTokens: 256, onProgress: (...call) => blobProgress.push(call) });
      const blobOutput = await fromBlob.generate(prompt, { temperature: 0, max_new_tokens: 2 });
      fromBlob.unload();
      const fromBuffer = await Engine.load(await blob.arrayBuffer(), { kvCacheTokens: 256 });
      const bufferOutput = await fromBuffer.generate(prompt, { temperature: 0, max_new_tokens: 2 });
      fromBuffer.unload();
      const urlProgress = [];
      const fromUrl = await Engine.load('/model.gguf', { cache: false, kvCacheTokens: 256, onProgress: (...call) => urlProgress.push(call) });
      const urlOutput = await fromUrl.generate(prompt, { temperature: 0, max_new_tokens: 2 });
      fromUrl.unload();
      return {
        size: blob.size,
        blobProgress,
        blobOutput,
        bufferOutput,
        urlProgress,
        urlOutput,
        cached: await cachedModels(),
        temporaryFiles: await Array.fromAsync((await navigator.storage.getDirectory()).keys()),
        summary: await inspectGguf(blob),
        missing: await error(() => Engine.load('/no-such-model.gguf', { cache: false })),
        notGguf: await error(() => Engine.load(new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8]))),
      };
    });
    const reference = greedy.find((g) => g.prompt === 'The capital of France is') ?? assert.fail('no greedy output to compare with');
    progressStages(result.blobProgress, ['upload']);
    assert.deepEqual(progressStages(result.urlProgress, ['download', 'upload']).download.at(-1), [result.size, result.size]);
    assert.deepEqual(result.blobOutput.output_ids, reference.web.output_ids.slice(0, 2));
    assert.deepEqual(result.bufferOutput.output_ids, reference.web.output_ids.slice(0, 2));
    assert.deepEqual(result.urlOutput.output_ids, reference.web.output_ids.slice(0, 2));
    assert.deepEqual(result.cached, [`${origin}/model.gguf`], 'a load with cache: false changed the cache');
    assert.deepEqual(result.temporaryFiles, [], 'a load with cache: false left its download behind');
    assert.equal(result.summary.architecture, 'llama');
    assert.match(result.missing, /^Error: .*\/no-such-model\.gguf.*HTTP 404/);
    assert.match(result.notGguf, /^Error: /);
    return `${result.missing}; ${result.notGguf}`;
  });

  await test('a second load of the same URL reads the Cache API, without a request; cachedModels, deleteCachedModel', async () => {
    const downloads = () => requests.filter((pathname) => pathname === '/model.gguf').length;
    const before = downloads();
    const result = await inPage(async () => {
      const { Engine, cachedModels, deleteCachedModel } = window.flint;
      const listed = await cachedModels();
      const progress = [];
      const engine = await Engine.load('/model.gguf', { kvCacheTokens: 256, onProgress: (...call) => progress.push(call) });
      const output = await engine.generate('The capital of France is', { temperature: 0, max_new_tokens: 2 });
      engine.unload();
      const deleted = await deleteCachedModel('/model.gguf');
      return { listed, progress, output, deleted, after: await cachedModels() };
    });
    assert.equal(downloads() - before, 0, 'the second load requested the model from the server');
    const reference = greedy.find((g) => g.prompt === 'The capital of France is') ?? assert.fail('no greedy output to compare with');
    assert.deepEqual(result.listed, [`${origin}/model.gguf`]);
    progressStages(result.progress, ['upload']);
    assert.deepEqual(result.output.output_ids, reference.web.output_ids.slice(0, 2));
    assert.equal(result.deleted, true);
    assert.deepEqual(result.after, []);
  });

  await test('in a Web Worker: load with progress, streamed greedy output, a bad parameter, abort', async () => {
    const result = await inPage(async (tokens) => {
      const progress = [];
      const engine = await window.flint.WorkerEngine.load('/model.gguf', {
        kvCacheTokens: 256,
        onProgress: (...call) => progress.push(call),
      });
      const items = [];
      for await (const item of engine.stream('The capital of France is', { temperature: 0, max_new_tokens: tokens })) {
        items.push(item);
      }
      let badParameter;
      try {
        await engine.generate('Hi', { top_k: 0 });
        badParameter = 'no error';
      } catch (error) {
        badParameter = `${error instanceof Error ? 'Error' : typeof error}: ${error.message}`;
      }
      const controller = new AbortController();
      const aborted = [];
      for await (const item of engine.stream('Once upon a time', { max_new_tokens: 200, ignore_eos: true, signal: controller.signal })) {
        aborted.push(item);
        if (aborted.length === 2) {
          controller.abort();
        }
      }
      const metrics = await engine.metrics();
      await engine.unload();
      return { progress, items, badParameter, aborted, metrics };
    }, tokens);
    const reference = greedy.find((g) => g.prompt === 'The capital of France is') ?? assert.fail('no greedy output to compare with');
    const size = statSync(modelPath).size;
    // The test before deleted the model from the cache: the worker downloads it again.
    assert.deepEqual(progressStages(result.progress, ['download', 'upload']).download.at(-1), [size, size]);
    assert.ok(result.items.length > 1, `${result.items.length} items`);
    assert.deepEqual(result.items.flatMap((item) => item.output_ids), reference.web.output_ids);
    assert.equal(result.items.map((item) => item.text).join(''), reference.web.text);
    assert.match(result.badParameter, /^Error: .*'top_k'/);
    assert.deepEqual(result.aborted.at(-1).meta_info.finish_reason, { type: 'abort' });
    assert.ok(result.aborted.length < 10, `${result.aborted.length} items after the abort at the second`);
    assert.equal(result.metrics.kv_blocks_used, 0, 'KV blocks still used after the abort');
    return `${result.items.length} items crossed the worker's channel; aborted after ${result.aborted.length}`;
  });

  await test('the demo page: load, a streamed answer, tokens/s; a screenshot', async () => {
    const demo = await context.newPage();
    demo.on('console', (message) => consoleLog.push(`[demo ${message.type()}] ${message.text()}`));
    try {
      await demo.goto(`${origin}/demo/index.html`);
      await demo.fill('#model-url', '/model.gguf');
      await demo.click('#load');
      await demo.waitForSelector('#prompt:not([disabled])', { timeout: 120_000 });
      await demo.fill('#max-tokens', '8');
      await demo.fill('#temperature', '0');
      await demo.fill('#prompt', 'What is the capital of France?');
      await demo.click('#send');
      await demo.waitForSelector('#stop:not([disabled])');
      await demo.waitForSelector('#stop[disabled]', { timeout: 240_000 });
      const answer = (await demo.textContent('.assistant')) ?? '';
      const status = (await demo.textContent('#status')) ?? '';
      // Greedy, SmolLM2 answers "The capital of France is Paris." (as in the chat test above).
      assert.match(answer, /Paris/, 'the greedy answer is not on the page');
      assert.ok(await demo.locator('.assistant').isVisible(), 'the answer is not visible');
      assert.match(status, /tokens\/s/);
      mkdirSync(artifactsDir, { recursive: true });
      const screenshot = path.join(artifactsDir, 'demo.png');
      await demo.screenshot({ path: screenshot, fullPage: true });
      assert.ok(statSync(screenshot).size > 1000, 'an empty screenshot');
      return `${JSON.stringify(answer)}; ${status}; ${screenshot}`;
    } finally {
      await demo.close();
    }
  });

  await test('unload: later calls are an Error', async () => {
    const message = await inPage(async () => {
      window.engine.unload();
      try {
        await window.engine.generate('Hi');
        return 'no error';
      } catch (error) {
        return error.message;
      }
    });
    assert.match(message, /unloaded/);
  });
} catch (error) {
  failures += 1;
  console.log(`FAIL the browser tests stopped: ${error.stack ?? error}`);
} finally {
  await closeBrowser();
  closeServer();
  rmSync(packDir, { recursive: true, force: true });
}

const seconds = ((Date.now() - started) / 1000).toFixed(1);
if (failures > 0) {
  mkdirSync(artifactsDir, { recursive: true });
  const logFile = path.join(artifactsDir, 'console.log');
  writeFileSync(logFile, `${consoleLog.join('\n')}\n`);
  console.log(`${failures} browser test(s) failed in ${seconds} s; the page's console: ${logFile}`);
  process.exit(1);
}
console.log(`browser tests passed in ${seconds} s`);
