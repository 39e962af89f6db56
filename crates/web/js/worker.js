// The Web Worker side of flint's worker host (worker-host.js): the engine runs here, off the
// page's main thread, and answers the page's messages.
//
// The protocol: the page sends `{id, op, ...}`; this side answers with messages carrying the
// same `id`: `{id, type: 'progress', loaded, total, stage}` while a model loads (the arguments
// of `Engine.load`'s `onProgress`), `{id, type: 'item', value}` for each item of a stream, then
// `{id, type: 'result', value}` (the whole answer, or `undefined` at a stream's end) or `{id,
// type: 'error', message}`. `{op: 'abort', target}` aborts request `target` (it still ends with
// its last item, finish_reason abort); `{op: 'close', target}` stops its stream (the page's loop
// broke off), which aborts it too.

import { Engine } from './flint.js';

let engine = null;
/** AbortControllers of the requests running, by request id. */
const running = new Map();

const send = (message) => self.postMessage(message);

self.onmessage = async ({ data }) => {
  const { id, op } = data;
  try {
    switch (op) {
      case 'load': {
        engine?.unload();
        engine = null;
        const onProgress = (loaded, total, stage) => send({ id, type: 'progress', loaded, total, stage });
        engine = await Engine.load(data.source, { ...data.options, onProgress });
        send({ id, type: 'result', value: engine.info() });
        break;
      }
      case 'info':
        send({ id, type: 'result', value: loadedEngine().info() });
        break;
      case 'metrics':
        send({ id, type: 'result', value: loadedEngine().metrics() });
        break;
      case 'generate':
        send({ id, type: 'result', value: await withSignal(id, (signal) => loadedEngine().generate(data.prompt, { ...data.params, signal })) });
        break;
      case 'stream':
        await withSignal(id, (signal) => forward(id, loadedEngine().stream(data.prompt, { ...data.params, signal })));
        break;
      case 'chat':
        await withSignal(id, async (signal) => {
          const answer = await loadedEngine().chat.completions.create({ ...data.body, signal });
          if (data.body?.stream) {
            await forward(id, answer);
          } else {
            send({ id, type: 'result', value: answer });
          }
        });
        break;
      case 'embed':
        send({ id, type: 'result', value: await loadedEngine().embeddings.create(data.body) });
        break;
      case 'abort':
      case 'close':
        running.get(data.target)?.abort();
        if (op === 'close') {
          running.get(data.target)?.closed?.();
        }
        send({ id, type: 'result' });
        break;
      case 'unload':
        for (const controller of running.values()) {
          controller.abort();
        }
        engine?.unload();
        engine = null;
        send({ id, type: 'result' });
        break;
      default:
        throw new Error(`the flint worker does not know the operation '${op}'`);
    }
  } catch (error) {
    send({ id, type: 'error', message: error instanceof Error ? error.message : String(error) });
  }
};

function loadedEngine() {
  if (engine === null) {
    throw new Error('no model is loaded in the worker: load one first');
  }
  return engine;
}

/** Runs request `id` with an AbortSignal that `{op: 'abort', target: id}` triggers. */
async function withSignal(id, body) {
  const controller = new AbortController();
  running.set(id, controller);
  try {
    return await body(controller.signal);
  } finally {
    running.delete(id);
  }
}

/** Sends the items of `items` as they come, then the end. */
async function forward(id, items) {
  const controller = running.get(id);
  let closed = false;
  if (controller) {
    controller.closed = () => {
      closed = true;
    };
  }
  for await (const item of items) {
    if (closed) {
      break;
    }
    send({ id, type: 'item', value: item });
  }
  send({ id, type: 'result', value: undefined });
}
