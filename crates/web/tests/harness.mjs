// What the browser tests (browser.test.mjs) and the browser benchmark (bench.mjs) share: the
// paths they read, a small static server for the package, its pages and the model on
// localhost, and headless Chromium with its WebGPU (SwiftShader where there is no GPU).

import { createReadStream, existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
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
const modelDir = env('FLINT_MODEL_DIR') ?? path.join(env('XDG_CACHE_HOME') ?? path.join(os.homedir(), '.cache'), 'flint', 'models');
/** SmolLM2-135M-Instruct Q4_1, as scripts/fetch-models.sh caches it. */
export const modelPath = path.join(modelDir, MODEL_FILE);

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
 * `--enable-unsafe-webgpu` alone. Returns the browser context and `close`, which also removes
 * the profile.
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
  return { context, close };
}
