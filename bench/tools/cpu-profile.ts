/**
 * The hot spots of a V8 CPU profile (`node --cpu-prof`, e.g. the worker's from
 * `bench/orchestration.ts --cpu-prof DIR`): self time per function and per package or file, so a
 * regression in the worker's CPU can be named without opening DevTools.
 *
 * Usage: npx tsx bench/tools/cpu-profile.ts FILE.cpuprofile [--top N]
 * (In bench/tools/, not bench/: `npm run bench` runs every bench/*.ts.)
 */
import { readFileSync } from 'node:fs';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface Profile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
  startTime: number;
  endTime: number;
}

/** A file's package (node_modules/<name> or <@scope/name>), else its path from the checkout, else V8's own label. */
export function whereOf(url: string): string {
  if (!url) return '(native or V8)';
  const nm = url.lastIndexOf('node_modules/');
  if (nm >= 0) {
    const parts = url.slice(nm + 'node_modules/'.length).split('/');
    return parts[0].startsWith('@') ? `${parts[0]}/${parts[1]}` : parts[0];
  }
  if (url.startsWith('node:')) return url;
  const dist = url.search(/\/(dist|workflow-bundle)/);
  return dist >= 0 ? url.slice(dist + 1) : url;
}

export function hotSpots(profile: Profile): { totalMs: number; byFunction: [string, number][]; byWhere: [string, number][] } {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const selfUs = new Map<number, number>();
  profile.samples.forEach((id, i) => selfUs.set(id, (selfUs.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0)));
  const fn = new Map<string, number>();
  const where = new Map<string, number>();
  let idle = 0;
  for (const [id, us] of selfUs) {
    const { functionName, url, lineNumber } = byId.get(id)!.callFrame;
    if (functionName === '(idle)') {
      idle += us;
      continue;
    }
    const key = `${functionName || '(anonymous)'} ${whereOf(url)}${url ? `:${lineNumber + 1}` : ''}`;
    fn.set(key, (fn.get(key) ?? 0) + us);
    where.set(whereOf(url), (where.get(whereOf(url)) ?? 0) + us);
  }
  const sorted = (m: Map<string, number>) => [...m].map(([k, us]) => [k, us / 1000] as [string, number]).sort((a, b) => b[1] - a[1]);
  const totalMs = (profile.endTime - profile.startTime - idle) / 1000;
  return { totalMs, byFunction: sorted(fn), byWhere: sorted(where) };
}

if (require.main === module) {
  const file = process.argv[2];
  const topArg = process.argv.indexOf('--top');
  const top = topArg >= 0 ? Number(process.argv[topArg + 1]) : 25;
  if (!file) {
    console.error('usage: npx tsx bench/tools/cpu-profile.ts FILE.cpuprofile [--top N]');
    process.exit(2);
  }
  const { totalMs, byFunction, byWhere } = hotSpots(JSON.parse(readFileSync(file, 'utf8')) as Profile);
  const pct = (x: number) => `${((100 * x) / totalMs).toFixed(1).padStart(5)} %`;
  console.log(`${file}: ${(totalMs / 1000).toFixed(2)} s on the main thread, not idle`);
  console.log('\nself time by package or file');
  for (const [k, v] of byWhere.slice(0, top)) console.log(`  ${pct(v)}  ${v.toFixed(0).padStart(7)} ms  ${k}`);
  console.log('\nself time by function');
  for (const [k, v] of byFunction.slice(0, top)) console.log(`  ${pct(v)}  ${v.toFixed(0).padStart(7)} ms  ${k}`);
}
