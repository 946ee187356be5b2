/**
 * Resolves an objective's blueprint (and the blueprints it references) before anything starts.
 * Interim: shipped blueprints only, until the blueprint loader (search path, override by id)
 * lands; callers use only this function.
 */
import { readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { parse } from 'yaml';
import { BlueprintSchema, type Blueprint } from '../blueprints/schema';
import type { ResolvedBlueprints } from '../core/types';

const SHIPPED_DIR = path.join(__dirname, '..', 'blueprints');

function shipped(): Map<string, Blueprint> {
  const map = new Map<string, Blueprint>();
  for (const file of readdirSync(SHIPPED_DIR).filter((f) => f.endsWith('.yaml'))) {
    const bp = BlueprintSchema.parse(parse(readFileSync(path.join(SHIPPED_DIR, file), 'utf8')));
    map.set(bp.id, bp);
  }
  return map;
}

export async function resolveObjectiveBlueprint(_repository: string, id: string): Promise<ResolvedBlueprints> {
  const all = shipped();
  const root = all.get(id);
  if (!root) throw new Error(`unknown blueprint "${id}" (known: ${[...all.keys()].join(', ')})`);
  const refs: Record<string, Blueprint> = {};
  const visit = (bp: Blueprint) => {
    for (const step of bp.steps) {
      const refId = step.type === 'blueprint_ref' ? step.ref : step.type === 'deterministic' && step.action === 'dispatch_streams' ? 'build-review' : undefined;
      if (!refId || refs[refId]) continue;
      const ref = all.get(refId);
      if (!ref) throw new Error(`blueprint "${bp.id}" refers to unknown blueprint "${refId}"`);
      refs[refId] = ref;
      visit(ref);
    }
  };
  visit(root);
  return { root, refs };
}
