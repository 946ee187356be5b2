/**
 * Resolves an objective's blueprint (and every blueprint it references) before anything starts,
 * from the search path: shipped < user folder < the repository's `.slipway/blueprints/`.
 */
import { loadBlueprints, resolveBlueprintForUse } from '../blueprints/loader';
import type { ResolvedBlueprints } from '../core/types';

export async function resolveObjectiveBlueprint(repository: string | undefined, id: string): Promise<ResolvedBlueprints> {
  // Checked for the objective level, where the objective workflow runs it.
  return resolveBlueprintForUse(await loadBlueprints(repository === undefined ? {} : { projectDir: repository }), id, 'objective');
}
