// Run a wasm32-wasip1 program under Node's WASI (V8, the engine Envoy
// embeds), with the current directory visible to it.
//   usage: node --no-warnings scripts/wasi-run.mjs PROGRAM.wasm
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
import { argv, exit } from 'node:process';

const wasi = new WASI({ version: 'preview1', args: [argv[2]], preopens: { '.': '.' }, returnOnExit: true });
const module = await WebAssembly.compile(await readFile(argv[2]));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
exit(wasi.start(instance));
