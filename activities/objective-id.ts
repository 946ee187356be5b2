/**
 * An objective id names branches (`slipway/<id>/...`) in the user's repository. Temporal rejects
 * a second workflow with the same id on one server, but not one on another server, or after the
 * first was deleted by retention: without a check, that objective would silently build on the
 * old run's branches. So the first run that prepares an id claims it in the repository itself,
 * atomically: `refs/slipway-objectives/<id>` pointing at a blob that names the claiming run.
 */
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BRANCH_PREFIX } from '../core/ids';
import { rawGit } from '../lib/git';

export const OBJECTIVE_CLAIM_PREFIX = 'refs/slipway-objectives';
const claimRef = (objectiveId: string) => `${OBJECTIVE_CLAIM_PREFIX}/${objectiveId}`;

/** What already uses `objectiveId` in `repository`, in words; undefined when it is free. */
export async function objectiveIdInUse(repository: string, objectiveId: string): Promise<string | undefined> {
  const claim = await rawGit(repository, ['for-each-ref', '--format=%(refname)', claimRef(objectiveId)]);
  const branches = (await rawGit(repository, ['for-each-ref', '--format=%(refname:short)', `refs/heads/${BRANCH_PREFIX}/${objectiveId}/`]))
    .split('\n')
    .filter(Boolean);
  if (!claim.trim() && branches.length === 0) return undefined;
  const what = [claim.trim() ? `claimed by an earlier run (${claimRef(objectiveId)})` : '', branches.length ? `branches ${branches.join(', ')}` : '']
    .filter(Boolean)
    .join('; ');
  return `objective id "${objectiveId}" was used before in ${repository}: ${what}. Choose another id (--id), or remove them: ` +
    `git update-ref -d ${claimRef(objectiveId)}${branches.length ? `; git branch -D ${branches.join(' ')}` : ''}`;
}

/**
 * Claims `objectiveId` for the run `owner` (idempotent for the same owner). Throws, with what is
 * in the way, when another run claimed it or its branches exist without a claim.
 */
export async function claimObjectiveId(repository: string, objectiveId: string, owner: string): Promise<void> {
  const ref = claimRef(objectiveId);
  const existing = (await rawGit(repository, ['for-each-ref', '--format=%(objectname)', ref])).trim();
  if (existing) {
    const holder = (await rawGit(repository, ['cat-file', 'blob', existing])).trim();
    if (holder === owner) return;
    throw new Error((await objectiveIdInUse(repository, objectiveId)) ?? `objective id "${objectiveId}" is claimed by ${holder}`);
  }
  const inUse = await objectiveIdInUse(repository, objectiveId);
  if (inUse) throw new Error(inUse);
  const scratch = await fs.mkdtemp(path.join(os.tmpdir(), 'slipway-claim-'));
  let blob: string;
  try {
    await fs.writeFile(path.join(scratch, 'owner'), `${owner}\n`);
    blob = (await rawGit(repository, ['hash-object', '-w', path.join(scratch, 'owner')])).trim();
  } finally {
    await fs.rm(scratch, { recursive: true, force: true });
  }
  // Created only if absent (the empty old value): of two racing runs, one wins.
  await rawGit(repository, ['update-ref', '-m', `slipway: objective ${objectiveId}`, ref, blob, '']).catch(async () => {
    const now = (await rawGit(repository, ['for-each-ref', '--format=%(objectname)', ref])).trim();
    if (now !== blob) throw new Error(`objective id "${objectiveId}" was claimed by another run at the same time`);
  });
}
