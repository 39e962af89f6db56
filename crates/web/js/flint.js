// flint in the browser: the JS API over the wasm-bindgen classes of crates/web/src.
//
// The Rust side speaks JSON text; this wrapper gives it the API of ARCHITECTURE.md ("The web
// package"): Engine.load from a URL (downloaded into the Cache API or a Blob), an ArrayBuffer,
// a typed array or a Blob/File, read by the wasm side a tensor at a time (`openSource`), with
// progress reported by stage; generate, stream (an async iterator), an OpenAI-style
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

/**
 * A GGUF file's summary (architecture, hyper-parameters, tokenizer, tensors), from its header.
 * `source` and the options `onProgress` and `cache` are those of `Engine.load`: a URL is
 * downloaded whole first (into the Cache API unless `cache` is false), then only its header
 * is read.
 */
export async function inspectGguf(source, options = {}) {
  const { onProgress, cache = true } = options ?? {};
  await init();
  const model = await openSource(source, onProgress, cache);
  try {
    return JSON.parse(await nativeInspectGguf(model));
  } finally {
    await model.close();
  }
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
    /** OpenAI's embeddings: `engine.embeddings.create({input, encoding_format})`. */
    this.embeddings = { create: async (body) => JSON.parse(await this.#native.embed(JSON.stringify(body ?? {}))) };
  }

  /**
   * Loads a GGUF model: `source` is a URL, an ArrayBuffer, a typed array, or a Blob/File. The
   * wasm side reads it a tensor at a time and uploads each to the GPU as it goes, so the page
   * never holds the whole file. A model from a URL is downloaded into the browser's Cache API
   * and read from there, then and at the next load of the same URL (`cache: false` downloads
   * it into a temporary file deleted once loaded, or a Blob, and keeps nothing; see
   * `cachedModels` and `deleteCachedModel`).
   *
   * `onProgress(loaded, total, stage)` reports two stages, each counting bytes from 0 to its
   * `total`: 'download' while a URL's bytes arrive (only when they are not cached yet; `total`
   * is null while the server has not said), then 'upload' while tensors go to the GPU. Each
   * stage's last call has `loaded === total`. The other options tune the engine (flint.d.ts).
   */
  static async load(source, options = {}) {
    const { onProgress, cache = true, ...engineOptions } = options ?? {};
    await init();
    const model = await openSource(source, onProgress, cache);
    const onUpload = onProgress && ((loaded, total) => onProgress(loaded, total, 'upload'));
    try {
      return new Engine(await NativeEngine.load(model, JSON.stringify(engineOptions), onUpload));
    } finally {
      await model.close();
    }
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

/**
 * A model source opened for random access, as the wasm side reads it: `{size, read(offset,
 * length)}`, where `read` resolves with a Uint8Array of exactly `length` bytes at `offset`;
 * `close()` lets go of what the download made once the load is done. The whole file is never
 * one buffer of the page: bytes already in memory are read where they are, a Blob or File a
 * slice at a time, and a URL is first downloaded to where the browser keeps it out of the
 * page's process (`downloadModel`).
 */
async function openSource(source, onProgress, cache) {
  if (source instanceof ArrayBuffer || ArrayBuffer.isView(source)) {
    const bytes = source instanceof ArrayBuffer ? new Uint8Array(source) : new Uint8Array(source.buffer, source.byteOffset, source.byteLength);
    return { size: bytes.byteLength, read: async (offset, length) => bytes.slice(...readRange(bytes.byteLength, offset, length)), close: async () => {} };
  }
  if (typeof Blob !== 'undefined' && source instanceof Blob) {
    return blobSource(source);
  }
  if (typeof source === 'string' || source instanceof URL) {
    const { blob, close } = await downloadModel(absoluteUrl(source), onProgress, cache);
    return blobSource(blob, close);
  }
  throw new TypeError('a model source is a URL, an ArrayBuffer, a typed array or a Blob');
}

/** A Blob or File as a model source: each read is a slice of it. */
function blobSource(blob, close = async () => {}) {
  return {
    size: blob.size,
    close,
    async read(offset, length) {
      const bytes = new Uint8Array(await blob.slice(...readRange(blob.size, offset, length)).arrayBuffer());
      if (bytes.byteLength !== length) {
        throw new Error(`reading the model gave ${bytes.byteLength} bytes at ${offset}, not ${length}: did its file change?`);
      }
      return bytes;
    },
  };
}

/** The start and end of a read, checked against the file's size. */
function readRange(size, offset, length) {
  if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0 || offset + length > size) {
    throw new RangeError(`a read of ${length} bytes at ${offset} is outside the model's ${size} bytes`);
  }
  return [offset, offset + length];
}

/**
 * The model at `url` as `{blob, close}`: from the Cache API when it is there, else downloaded
 * into it (`cache`); else (no Cache API, `cache` false, or no room in it) downloaded into a
 * temporary file of the origin's private file system that `close` deletes; else into a Blob.
 * Chromium keeps the first two on disk and a Blob in the browser process, none in the page's.
 */
async function downloadModel(url, onProgress, cache) {
  // The Cache API exists in secure contexts (https, localhost), in pages and workers.
  const models = cache && typeof caches !== 'undefined' ? await caches.open(MODEL_CACHE) : null;
  if (models !== null) {
    const cached = await models.match(url);
    if (cached) {
      return { blob: await cached.blob(), close: async () => {} };
    }
    const { body, total } = await fetchModel(url);
    const headers = { 'content-type': 'application/octet-stream' };
    if (total !== null) {
      headers['content-length'] = String(total);
    }
    try {
      // The body goes to the cache as it arrives, at the pace the cache writes it.
      await models.put(url, new Response(countDownload(body, total, onProgress), { headers }));
      const stored = await models.match(url);
      if (stored) {
        return { blob: await stored.blob(), close: async () => {} };
      }
      throw new Error('it was evicted as soon as it was stored');
    } catch (error) {
      // A full disk or quota costs this load a second download, not the load.
      console.warn(`flint: the model from ${url} could not be cached (${error}); downloading it again without the cache`);
    }
  }
  // Origin private file systems exist in secure contexts; writing them from a page needs
  // Chromium 86 or Firefox 111, and Safari has it only in workers.
  if (typeof navigator !== 'undefined' && navigator.storage?.getDirectory) {
    const { body, total } = await fetchModel(url);
    try {
      return await downloadToFile(countDownload(body, total, onProgress));
    } catch (error) {
      console.warn(`flint: the model from ${url} could not be written to a temporary file (${error}); downloading it again into a Blob`);
    }
  }
  const { body, total } = await fetchModel(url);
  return { blob: await collectBlob(countDownload(body, total, onProgress)), close: async () => {} };
}

/** A byte stream written into a new file of the origin's private file system: the File, and a `close` that deletes it. */
async function downloadToFile(stream) {
  const root = await navigator.storage.getDirectory();
  const name = `flint-download-${crypto.randomUUID()}`;
  const handle = await root.getFileHandle(name, { create: true });
  const close = () => root.removeEntry(name).catch(() => {});
  try {
    await stream.pipeTo(await handle.createWritable());
    return { blob: await handle.getFile(), close };
  } catch (error) {
    await close();
    throw error;
  }
}

/** The body of `url` as a stream, and its length when the server says and it is not compressed. */
async function fetchModel(url) {
  const response = await fetch(url);
  if (!response.ok || response.body === null) {
    throw new Error(`cannot fetch the model at ${url}: HTTP ${response.status} ${response.statusText}`);
  }
  const length = Number(response.headers.get('content-length'));
  // A compressed response's length is not the length of the bytes the stream gives.
  const total = Number.isSafeInteger(length) && length > 0 && !response.headers.get('content-encoding') ? length : null;
  return { body: response.body, total };
}

/** `body`, passed through with its backpressure, reporting the 'download' stage's progress. */
function countDownload(body, total, onProgress) {
  let loaded = 0;
  onProgress?.(0, total, 'download');
  return body.pipeThrough(
    new TransformStream({
      transform(chunk, controller) {
        loaded += chunk.byteLength;
        onProgress?.(loaded, total, 'download');
        controller.enqueue(chunk);
      },
      flush() {
        // The stage ends with loaded === total, also when the length was unknown or wrong.
        if (loaded !== total) {
          onProgress?.(loaded, loaded, 'download');
        }
      },
    }),
  );
}

/** Chunks gathered before they join a downloading Blob: few Blob parts, little page memory. */
const BLOB_PART_BYTES = 16 << 20;

/**
 * A byte stream as one Blob, built as it arrives so that the page holds a few chunks at most.
 * The last resort: Chromium 156 keeps a Blob in the browser process's memory, and one it paged
 * to disk instead (1.2 GiB built from 16 MiB parts, each its own Blob) could not be read back.
 */
async function collectBlob(stream) {
  const reader = stream.getReader();
  let blob = new Blob([]);
  let chunks = [];
  let chunkBytes = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) {
      return new Blob([blob, ...chunks]);
    }
    chunks.push(value);
    chunkBytes += value.byteLength;
    if (chunkBytes >= BLOB_PART_BYTES) {
      blob = new Blob([blob, ...chunks]);
      chunks = [];
      chunkBytes = 0;
    }
  }
}
