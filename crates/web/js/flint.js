// flint in the browser: the JS API over the wasm-bindgen classes of crates/web/src.
//
// The Rust side speaks JSON text; this wrapper gives it the API of ARCHITECTURE.md ("The web
// package"): Engine.load from a URL (streamed with fetch, progress reported), an ArrayBuffer,
// a typed array or a Blob/File; generate, stream (an async iterator), an OpenAI-style
// chat.completions.create; AbortSignals that end a request with finish_reason "abort" and free
// its KV blocks; unload. Types: flint.d.ts. The same API with the engine in a Web Worker:
// WorkerEngine (worker-host.js).

import initWasm, { Engine as NativeEngine, gpuInfo as nativeGpuInfo, inspectGguf as nativeInspectGguf } from '../pkg/flint_web.js';

export { WorkerEngine } from './worker-host.js';

let wasmReady = null;

/**
 * Loads and instantiates the wasm module once. `Engine.load` calls it; call it first only to
 * fetch the `.wasm` file from somewhere else than beside `pkg/flint_web.js`.
 */
export function init(moduleOrPath) {
  wasmReady ??= initWasm(moduleOrPath === undefined ? undefined : { module_or_path: moduleOrPath });
  return wasmReady;
}

/** The browser's WebGPU adapter as flint sees it, and optionally its measured bandwidth. */
export async function gpuInfo(probeBytes = 0) {
  await init();
  return JSON.parse(await nativeGpuInfo(probeBytes));
}

/** A GGUF file's summary (architecture, hyper-parameters, tokenizer, tensors), from its bytes. */
export async function inspectGguf(source, options = {}) {
  await init();
  return JSON.parse(nativeInspectGguf(await readSource(source, options.onProgress)));
}

/** A model loaded onto the browser's WebGPU device. */
export class Engine {
  #native;
  /** Streams not finished yet: `unload` aborts them. */
  #active = new Set();

  constructor(native) {
    if (!(native instanceof NativeEngine)) {
      throw new TypeError('use `await Engine.load(source)` to make an Engine');
    }
    this.#native = native;
    /** OpenAI's chat completions: `engine.chat.completions.create({messages, stream, ...})`. */
    this.chat = { completions: { create: (body) => this.#chatCompletion(body) } };
  }

  /**
   * Loads a GGUF model: `source` is a URL (fetched as a stream; `onProgress(loaded, total)` is
   * called as bytes arrive, `total` is null when the server does not say), an ArrayBuffer, a
   * typed array, or a Blob/File. A model from a URL is kept in the browser's Cache API and
   * the next load of the same URL reads it from there (`cache: false` does neither; see
   * `cachedModels` and `deleteCachedModel`). The other options tune the engine (flint.d.ts).
   */
  static async load(source, options = {}) {
    const { onProgress, cache = true, ...engineOptions } = options ?? {};
    await init();
    const bytes = await readSource(source, onProgress, cache);
    return new Engine(await NativeEngine.load(bytes, JSON.stringify(engineOptions)));
  }

  /** The model's name, architecture and context, and the WebGPU device. */
  info() {
    return JSON.parse(this.#native.info());
  }

  /** The engine's metrics: sequences running and waiting, KV blocks used and free, tokens/s. */
  metrics() {
    return JSON.parse(this.#native.metrics());
  }

  /**
   * Generates the continuation of `prompt` (a string, or an array of token ids) and resolves
   * with the GenerateOutput ({text, output_ids, meta_info}), or an array of them when `n` > 1.
   * An aborted request resolves with what it had, finish_reason `{type: "abort"}`.
   */
  async generate(prompt, params = {}) {
    const { signal, ...rest } = params ?? {};
    const outputs = [];
    for await (const output of this.#iterate(this.#native.request(JSON.stringify(prompt), JSON.stringify(rest), false), signal)) {
      outputs.push(output);
    }
    return outputs.length === 1 ? outputs[0] : outputs;
  }

  /**
   * Streams the continuation of `prompt`: an async iterator of GenerateOutput items, each with
   * the new text and token ids since the previous item; the last carries the finish reason.
   * Breaking out of the loop aborts the request.
   */
  stream(prompt, params = {}) {
    const { signal, ...rest } = params ?? {};
    return this.#iterate(this.#native.request(JSON.stringify(prompt), JSON.stringify(rest), true), signal);
  }

  /**
   * Lets the model go: running requests are aborted, later calls throw, and the GPU buffers
   * are freed once the engine's step loop has ended.
   */
  unload() {
    for (const stream of this.#active) {
      stream.abort();
      stream.close();
    }
    this.#active.clear();
    this.#native.unload();
  }

  async #chatCompletion(body) {
    const { signal, ...rest } = body ?? {};
    const stream = this.#native.chat(JSON.stringify(rest));
    const items = this.#iterate(stream, signal);
    if (rest.stream) {
      return items;
    }
    let response;
    for await (const item of items) {
      response = item;
    }
    return response;
  }

  async *#iterate(stream, signal) {
    this.#active.add(stream);
    const abort = () => stream.abort();
    signal?.addEventListener('abort', abort);
    if (signal?.aborted) {
      abort();
    }
    try {
      for (;;) {
        const json = await stream.next();
        if (json === undefined) {
          return;
        }
        yield JSON.parse(json);
      }
    } finally {
      signal?.removeEventListener('abort', abort);
      this.#active.delete(stream);
      stream.close();
      stream.free();
    }
  }
}

/** The Cache API cache that holds models loaded from URLs. */
const MODEL_CACHE = 'flint-models';

/** The URLs of the models in the browser's cache. */
export async function cachedModels() {
  const cache = await caches.open(MODEL_CACHE);
  return (await cache.keys()).map((request) => request.url);
}

/** Deletes the model of `url` from the browser's cache; resolves with whether it was there. */
export async function deleteCachedModel(url) {
  const cache = await caches.open(MODEL_CACHE);
  return cache.delete(absoluteUrl(url));
}

function absoluteUrl(url) {
  return new URL(url, globalThis.location?.href).href;
}

/** The bytes of a model source, as a Uint8Array; `cache` keeps URLs' bytes in the Cache API. */
async function readSource(source, onProgress, cache = false) {
  if (source instanceof ArrayBuffer) {
    return new Uint8Array(source);
  }
  if (ArrayBuffer.isView(source)) {
    return new Uint8Array(source.buffer, source.byteOffset, source.byteLength);
  }
  if (typeof Blob !== 'undefined' && source instanceof Blob) {
    return readStream(source.stream(), source.size, onProgress);
  }
  if (typeof source === 'string' || source instanceof URL) {
    const url = absoluteUrl(source);
    // The Cache API exists in secure contexts (https, localhost), in pages and workers.
    const models = cache && typeof caches !== 'undefined' ? await caches.open(MODEL_CACHE) : null;
    const cached = await models?.match(url);
    if (cached?.body) {
      return readStream(cached.body, Number(cached.headers.get('content-length')) || null, onProgress);
    }
    const bytes = await fetchBytes(url, onProgress);
    if (models !== null) {
      const headers = { 'content-type': 'application/octet-stream', 'content-length': String(bytes.byteLength) };
      // A full disk or quota only costs the next load a download.
      await models.put(url, new Response(bytes, { headers })).catch((error) => {
        console.warn(`flint: the model from ${url} could not be cached: ${error}`);
      });
    }
    return bytes;
  }
  throw new TypeError('a model source is a URL, an ArrayBuffer, a typed array or a Blob');
}

/** The body of `url`, streamed. */
async function fetchBytes(source, onProgress) {
  const response = await fetch(source);
  if (!response.ok || response.body === null) {
    throw new Error(`cannot fetch the model at ${source}: HTTP ${response.status} ${response.statusText}`);
  }
  const length = Number(response.headers.get('content-length'));
  const encoded = response.headers.get('content-encoding');
  // A compressed response's length is not the length of the bytes the stream gives.
  const total = Number.isSafeInteger(length) && length > 0 && !encoded ? length : null;
  return readStream(response.body, total, onProgress);
}

/** Reads a byte stream into one Uint8Array, reporting progress. */
async function readStream(body, total, onProgress) {
  const reader = body.getReader();
  let bytes = total === null ? null : new Uint8Array(total);
  const chunks = [];
  let loaded = 0;
  onProgress?.(0, total);
  for (;;) {
    const { done, value } = await reader.read();
    if (done) {
      break;
    }
    if (bytes !== null && loaded + value.byteLength <= bytes.byteLength) {
      bytes.set(value, loaded);
    } else {
      if (bytes !== null) {
        // Longer than announced: fall back to collecting chunks.
        chunks.push(bytes.subarray(0, loaded));
        bytes = null;
      }
      chunks.push(value);
    }
    loaded += value.byteLength;
    onProgress?.(loaded, total);
  }
  if (bytes !== null) {
    return loaded === bytes.byteLength ? bytes : bytes.subarray(0, loaded);
  }
  const all = new Uint8Array(loaded);
  let offset = 0;
  for (const chunk of chunks) {
    all.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return all;
}
