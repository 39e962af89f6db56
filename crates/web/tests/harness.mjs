// What the browser tests (browser.test.mjs, large-model.test.mjs) and the browser benchmarks
// (bench.mjs, bench-large.mjs) share: the paths they read, a small static server for the
// package, its pages and the model on localhost, headless Chromium with its WebGPU
// (SwiftShader where there is no GPU), and the memory of Chromium's processes.

import { createReadStream, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

export const webDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const repoDir = path.resolve(webDir, '../..');
/** An environment variable, unless unset or empty. */
export const env = (name) => (process.env[name] ? process.env[name] : undefined);

const MODEL_FILE = 'SmolLM2-135M-Instruct.Q4_1.gguf';
const cacheDir = path.join(env('XDG_CACHE_HOME') ?? path.join(os.homedir(), '.cache'), 'flint');
const modelDir = env('FLINT_MODEL_DIR') ?? path.join(cacheDir, 'models');
/** SmolLM2-135M-Instruct Q4_1, as scripts/fetch-models.sh caches it. */
export const modelPath = path.join(modelDir, MODEL_FILE);
/** A tiny random-weight Qwen2 whose llama.cpp embeddings are in tests/fixtures/tiny_models/embeddings.json. */
export const tinyEmbeddingModelPath = path.join(modelDir, 'tiny', 'tiny-qwen2-q8_0.gguf');
/** The tool-calling checks' tiny random-weight Qwen2, which scripts/fixtures/make_tiny_models.sh makes. */
export const tinyModelPath = path.join(modelDir, 'tiny', 'tiny-qwen2-tools.gguf');
/** The synthetic model `name` (e.g. 'llama-3.2-1b.q8_0') where scripts/synth-model.sh writes it. */
export const syntheticModelPath = (name) => path.join(env('FLINT_SYNTH_DIR') ?? path.join(cacheDir, 'synthetic'), `${name}.synthetic.gguf`);

/** Exits with a message naming what is missing and how to get it, unless every file exists. */
export function requireFiles(who, files) {
  for (const [what, file, how] of files) {
    if (!existsSync(file)) {
      console.error(`${who}: ${what} is missing (${file}): ${how}`);
      process.exit(1);
    }
  }
}

const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.mjs': 'text/javascript', '.wasm': 'application/wasm', '.json': 'application/json' };

/**
 * Serves /model.gguf and the package's folders (/js, /pkg, /tests, /demo, /bench) from
 * 127.0.0.1 on a free port, and whatever `extra(pathname)` maps to a file. Returns the origin,
 * the paths requested so far, and `close`.
 */
export async function serve(extra = () => undefined) {
  const requests = [];
  const server = http.createServer((request, response) => {
    const url = new URL(request.url, 'http://localhost');
    requests.push(url.pathname);
    let file;
    if (url.pathname === '/model.gguf') {
      file = modelPath;
    } else if (/^\/(js|pkg|tests|demo|bench)\/[\w.-]+$/.test(url.pathname)) {
      file = path.join(webDir, url.pathname);
    } else {
      file = extra(url.pathname);
    }
    if (!file || !existsSync(file)) {
      response.writeHead(404).end();
      return;
    }
    response.writeHead(200, {
      'content-type': TYPES[path.extname(file)] ?? 'application/octet-stream',
      'content-length': statSync(file).size,
      'cache-control': 'no-store',
    });
    createReadStream(file).pipe(response);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { origin: `http://127.0.0.1:${server.address().port}`, requests, close: () => server.close() };
}

/**
 * Headless Chromium (Debian's, at /usr/bin/chromium) with WebGPU, in a fresh profile. Chromium
 * 156 needs nothing beyond these flags: on a page served from localhost (a secure context;
 * about:blank has no navigator.gpu) `requestAdapter()` gives SwiftShader's adapter with
 * `--enable-unsafe-webgpu` alone. Returns the browser context, its profile's folder and
 * `close`, which also removes the profile.
 */
export async function launchChromium() {
  const userDataDir = mkdtempSync(path.join(os.tmpdir(), 'flint-chromium-'));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--enable-unsafe-webgpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--no-first-run',
    ],
  });
  const close = async () => {
    await context.close().catch(() => {});
    rmSync(userDataDir, { recursive: true, force: true });
  };
  return { context, userDataDir, close };
}

/**
 * The processes of the Chromium whose profile is `userDataDir` (Linux's /proc): the browser
 * process and its descendants (the zygote forks the renderers), each with its `type` (its
 * `--type=` flag: 'renderer' for pages', 'gpu-process', ...; 'browser' for the browser's own,
 * 'ui-renderer' for the renderer of its UI) and, in
 * bytes, its resident memory now (`rss`, VmRSS) and at its peak (`peak`, VmHWM).
 */
export function chromiumProcesses(userDataDir) {
  const processes = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) {
      continue;
    }
    try {
      // Split at spaces too: Chromium's forked processes rewrite their title into one string.
      const args = readFileSync(`/proc/${name}/cmdline`, 'utf8').split(/[\0 ]/);
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      // The fields after the command's name, which is in parentheses and may hold spaces.
      const parent = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      processes.push({ pid: Number(name), parent, args });
    } catch {
      // It ended while the folder was read.
    }
  }
  const browser = processes.find((p) => p.args.includes(`--user-data-dir=${userDataDir}`) && !p.args.some((arg) => arg.startsWith('--type=')));
  if (!browser) {
    throw new Error(`no Chromium process has the profile ${userDataDir}`);
  }
  const ours = new Set([browser.pid]);
  for (let grown = true; grown; ) {
    grown = false;
    for (const p of processes) {
      if (!ours.has(p.pid) && ours.has(p.parent)) {
        ours.add(p.pid);
        grown = true;
      }
    }
  }
  return processes
    .filter((p) => ours.has(p.pid))
    .flatMap((p) => {
      let type = p === browser ? 'browser' : (p.args.find((arg) => arg.startsWith('--type='))?.slice('--type='.length) ?? 'other');
      if (type === 'renderer' && p.args.includes('--top-chrome-webui')) {
        // The renderer of the browser's own UI, not of a page.
        type = 'ui-renderer';
      }
      try {
        const status = readFileSync(`/proc/${p.pid}/status`, 'utf8');
        const kib = (field) => Number(status.match(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm'))?.[1] ?? 0);
        return [{ pid: p.pid, type, rss: kib('VmRSS') * 1024, peak: kib('VmHWM') * 1024 }];
      } catch {
        return [];
      }
    });
}

/**
 * Samples the resident memory of all of Chromium's processes together every `intervalMs`
 * (no single /proc figure gives the peak of a sum). `stop()` returns the highest sum seen.
 */
export function sampleChromiumMemory(userDataDir, intervalMs = 200) {
  let peak = 0;
  const sample = () => {
    try {
      peak = Math.max(peak, chromiumProcesses(userDataDir).reduce((sum, p) => sum + p.rss, 0));
    } catch {
      // Chromium is closing.
    }
  };
  sample();
  const timer = setInterval(sample, intervalMs);
  return {
    stop: () => {
      clearInterval(timer);
      sample();
      return peak;
    },
  };
}

/** Bytes as MiB, for reports. */
export const mib = (bytes) => `${(bytes / (1 << 20)).toFixed(0)} MiB`;

/**
 * Loads the model `file` from a URL in a fresh headless Chromium (`Engine.load` in the test
 * page; `cache` as its option), generates `tokens` tokens greedily, and measures: the load's
 * seconds, each progress stage's first and last call, the output, each Chromium process's
 * peak resident memory (VmHWM) and the peak of their sum (sampled). SwiftShader makes a large
 * model's forward pass slow: keep `tokens` small.
 */
export async function measureLoad(file, { tokens = 2, cache = true, log = () => {} } = {}) {
  const { origin, close: closeServer } = await serve((pathname) => (pathname === '/large.gguf' ? file : undefined));
  const { context, userDataDir, close: closeBrowser } = await launchChromium();
  const memory = sampleChromiumMemory(userDataDir);
  try {
    const page = context.pages()[0] ?? (await context.newPage());
    page.on('console', (message) => log(`[page ${message.type()}] ${message.text()}`));
    page.on('pageerror', (error) => log(`[pageerror] ${error.stack ?? error}`));
    await page.goto(`${origin}/tests/page.html`);
    await page.waitForFunction(() => window.flint !== undefined, null, { timeout: 30_000 });
    const result = await page.evaluate(
      async ([tokens, cache]) => {
        const started = performance.now();
        const seconds = () => (performance.now() - started) / 1000;
        // Per stage: its first and last call; an engine without stages reports 'bytes'.
        const stages = {};
        const engine = await window.flint.Engine.load('/large.gguf', {
          cache,
          kvCacheTokens: 64,
          onProgress: (loaded, total, stage = 'bytes') => {
            stages[stage] ??= { calls: 0, firstS: seconds() };
            Object.assign(stages[stage], { calls: stages[stage].calls + 1, lastS: seconds(), loaded, total });
          },
        });
        const loadS = seconds();
        const output = await engine.generate('Hello', { temperature: 0, max_new_tokens: tokens, ignore_eos: true });
        const generateS = seconds() - loadS;
        const info = engine.info();
        engine.unload();
        return { loadS, generateS, stages, outputIds: output.output_ids, model: info.model, adapter: info.device.adapter };
      },
      [tokens, cache],
    );
    const processes = chromiumProcesses(userDataDir);
    const rendererPeak = Math.max(...processes.filter((p) => p.type === 'renderer').map((p) => p.peak));
    return { ...result, processes, rendererPeak, totalPeak: memory.stop() };
  } finally {
    memory.stop();
    await closeBrowser();
    closeServer();
  }
}
