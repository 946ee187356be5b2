/**
 * Layering: which top-level folders may import which. Side effects stay out of the pure layers,
 * workflows import activities by type only (Temporal's sandboxed workflow code), and nothing
 * below the process entry points reaches up into workers, the CLI or the API.
 *
 *   core (pure tables and types) <- lib (git, files, settings) <- agents (provider definitions)
 *   <- blueprints, config (loaders) <- activities (side effects) <- workers <- api, cli
 *   workflows: core, blueprints' pure parts and their own modules; activities as types only.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = path.join(__dirname, '..');
const MAY_IMPORT: Record<string, string[]> = {
  core: ['core'],
  lib: ['core', 'lib'],
  agents: ['core', 'lib', 'agents'],
  blueprints: ['core', 'lib', 'blueprints'],
  config: ['core', 'lib', 'agents', 'blueprints', 'config'],
  activities: ['core', 'lib', 'agents', 'blueprints', 'config', 'activities'],
  workflows: ['core', 'workflows'],
  // The sandbox service worker hosts the API in its process.
  workers: ['core', 'lib', 'agents', 'blueprints', 'config', 'activities', 'workflows', 'workers', 'api'],
};
/** Imported as types only: erased at build time, so no code of theirs runs in the importer. */
const TYPE_ONLY_ALLOWED: Record<string, string[]> = {
  workflows: ['activities', 'blueprints', 'agents', 'workers'],
};

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = path.join(dir, name);
    return statSync(p).isDirectory() ? sources(p) : p.endsWith('.ts') ? [p] : [];
  });
}

function imports(file: string): Array<{ spec: string; typeOnly: boolean; line: number }> {
  const out: Array<{ spec: string; typeOnly: boolean; line: number }> = [];
  const text = readFileSync(file, 'utf8');
  const re = /^(import|export)\s+(type\s+)?[^;]*?from\s+'([^']+)'|import\('([^']+)'\)|require\('([^']+)'\)/gms;
  for (const m of text.matchAll(re)) {
    const spec = m[3] ?? m[4] ?? m[5];
    if (!spec?.startsWith('.')) continue;
    out.push({ spec, typeOnly: Boolean(m[2]), line: text.slice(0, m.index).split('\n').length });
  }
  return out;
}

describe('layering', () => {
  for (const [layer, allowed] of Object.entries(MAY_IMPORT)) {
    it(`${layer}/ imports only ${allowed.join(', ')}${TYPE_ONLY_ALLOWED[layer] ? ` (and types of ${TYPE_ONLY_ALLOWED[layer].join(', ')})` : ''}`, () => {
      const violations: string[] = [];
      for (const file of sources(path.join(ROOT, layer))) {
        for (const i of imports(file)) {
          const target = path.relative(ROOT, path.resolve(path.dirname(file), i.spec)).split(path.sep)[0];
          if (allowed.includes(target)) continue;
          if (i.typeOnly && TYPE_ONLY_ALLOWED[layer]?.includes(target)) continue;
          violations.push(`${path.relative(ROOT, file)}:${i.line}: ${i.typeOnly ? 'type ' : ''}import of ${i.spec}`);
        }
      }
      expect(violations).toEqual([]);
    });
  }
});
