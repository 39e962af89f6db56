// A model larger than a page should hold, in headless Chromium: a synthetic Llama-3.2-1B in
// Q8_0 (1.2 GiB; scripts/synth-model.sh writes it, scripts/test-web.sh runs this file) loaded
// from a URL by `Engine.load`, then two tokens generated greedily. The wasm side reads the file
// in pieces (16 MiB at most) from the Cache API's copy and uploads each as it goes, so the peak
// resident memory of the page's renderer process (VmHWM) stays under a bound far below the
// file's size: 285 MiB, where reading the whole file into the page, as flint-web did before,
// peaked at 2138 MiB (BENCHMARKS.md, "loading a 1.2 GiB model in the browser").
//
// Environment: FLINT_LARGE_MODEL (the model; by default where scripts/synth-model.sh puts
// llama-3.2-1b q8_0), FLINT_RENDERER_PEAK_MIB (the bound, 512).

import assert from 'node:assert/strict';
import { statSync } from 'node:fs';
import { env, measureLoad, mib, requireFiles, syntheticModelPath } from './harness.mjs';

const modelFile = env('FLINT_LARGE_MODEL') ?? syntheticModelPath('llama-3.2-1b.q8_0');
const limitBytes = Number(env('FLINT_RENDERER_PEAK_MIB') ?? 512) * 2 ** 20;
const tokens = 2;

requireFiles('large-model test', [['the synthetic model', modelFile, 'run scripts/synth-model.sh target/debug/flint llama-3.2-1b q8_0']]);

const size = statSync(modelFile).size;
const log = [];
const started = Date.now();
try {
  assert.ok(size >= 2 ** 30, `the model has ${mib(size)}, less than the 1 GiB this test is about`);
  const result = await measureLoad(modelFile, { tokens, log: (line) => log.push(line) });
  const upload = result.stages.upload ?? assert.fail(`no 'upload' stage in the progress calls: ${JSON.stringify(result.stages)}`);
  const download = result.stages.download ?? assert.fail(`no 'download' stage in the progress calls: ${JSON.stringify(result.stages)}`);
  assert.deepEqual([download.loaded, download.total], [size, size]);
  assert.equal(upload.loaded, upload.total, 'the upload stage did not end at its total');
  assert.ok(download.lastS <= upload.firstS, 'the upload stage began before the download ended');
  assert.equal(result.outputIds.length, tokens);
  const processes = result.processes.map((p) => `${p.type} ${p.pid}: ${mib(p.peak)}`).join(', ');
  console.log(
    `large model: ${mib(size)} loaded in ${result.loadS.toFixed(1)} s (${mib(size / result.loadS)}/s; download ${download.lastS.toFixed(1)} s, ` +
      `upload ${(upload.lastS - upload.firstS).toFixed(1)} s), ${tokens} tokens in ${result.generateS.toFixed(1)} s; ` +
      `peak resident memory: the page's renderer ${mib(result.rendererPeak)} (bound ${mib(limitBytes)}), all of Chromium ${mib(result.totalPeak)}\n` +
      `  per process: ${processes}`,
  );
  assert.ok(result.rendererPeak <= limitBytes, `the page's renderer peaked at ${mib(result.rendererPeak)}, over ${mib(limitBytes)}`);
  console.log(`large-model test passed in ${((Date.now() - started) / 1000).toFixed(1)} s`);
} catch (error) {
  console.log(`FAIL large-model test (${((Date.now() - started) / 1000).toFixed(1)} s): ${error.stack ?? error}`);
  console.log(log.join('\n'));
  process.exit(1);
}
