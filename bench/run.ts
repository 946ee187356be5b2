/**
 * `npm run bench [-- [name...] [options]]`: runs the benchmarks in bench/ (every
 * `bench/<name>.ts` but this runner), one after another, each in its own process, passing the
 * options on (`--quick`, `--json`, ...). Names pick some (`npm run bench -- sandbox --quick`).
 */
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import path from 'node:path';

const dir = __dirname;
const tsx = path.join(dir, '..', 'node_modules', '.bin', 'tsx');
// Names first, then options (passed on as they are, values included: `--dir /dev/shm`).
const args = process.argv.slice(2);
const firstOption = args.findIndex((a) => a.startsWith('-'));
const names = firstOption < 0 ? args : args.slice(0, firstOption);
const flags = firstOption < 0 ? [] : args.slice(firstOption);
const all = readdirSync(dir)
  .filter((f) => f.endsWith('.ts') && f !== 'run.ts' && !f.endsWith('.d.ts'))
  .map((f) => path.basename(f, '.ts'))
  .sort();
const unknown = names.filter((n) => !all.includes(n));
if (unknown.length > 0) {
  console.error(`unknown benchmark${unknown.length > 1 ? 's' : ''}: ${unknown.join(', ')} (have: ${all.join(', ')})`);
  process.exit(2);
}
const selected = names.length > 0 ? all.filter((n) => names.includes(n)) : all;
const failed: string[] = [];
for (const name of selected) {
  if (!flags.includes('--json')) console.log(`\n=== bench/${name}.ts ${flags.join(' ')}`.trimEnd());
  const run = spawnSync(tsx, [path.join(dir, `${name}.ts`), ...flags], { stdio: 'inherit' });
  if (run.status !== 0) failed.push(`${name} (exit ${run.status ?? run.signal})`);
}
if (failed.length > 0) {
  console.error(`\nfailed: ${failed.join(', ')}`);
  process.exit(1);
}
