// Loads a large model in headless Chromium from a URL (`Engine.load` in the test page) and
// generates a few tokens greedily, then prints the load's figures as JSON on stdout: seconds
// and bytes/s of the load and of its download and upload stages, the peak resident memory of
// the page's renderer and of each Chromium process, and the peak of their sum.
// scripts/bench-web-large.sh runs it beside native `flint bench` on the same file.
//
//   node crates/web/tests/bench-large.mjs MODEL_FILE [TOKENS (4)] [cache|no-cache (cache)]

import { statSync } from 'node:fs';
import { measureLoad, requireFiles } from './harness.mjs';

const [file, tokens = '4', cacheMode = 'cache'] = process.argv.slice(2);
if (!file || !['cache', 'no-cache'].includes(cacheMode)) {
  console.error('usage: node crates/web/tests/bench-large.mjs MODEL_FILE [TOKENS] [cache|no-cache]');
  process.exit(2);
}
requireFiles('large-model benchmark', [['the model', file, 'run scripts/synth-model.sh']]);

const bytes = statSync(file).size;
const result = await measureLoad(file, { tokens: Number(tokens), cache: cacheMode === 'cache', log: (line) => console.error(line) });
const { download, upload } = result.stages;
console.log(
  JSON.stringify({
    file,
    bytes,
    cache: cacheMode === 'cache',
    loadS: result.loadS,
    loadBytesPerS: bytes / result.loadS,
    downloadS: download?.lastS ?? 0,
    uploadS: upload ? upload.lastS - upload.firstS : null,
    uploadedBytes: upload?.total ?? null,
    tokens: result.outputIds.length,
    generateS: result.generateS,
    rendererPeakBytes: result.rendererPeak,
    totalPeakBytes: result.totalPeak,
    processes: result.processes,
  }),
);
