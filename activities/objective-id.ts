/**
 * An objective id names branches (`slipway/<id>/...`) in the user's repository. Temporal rejects
 * a second workflow with the same id on one server, but not one on another server, or after the
 * first was deleted by retention: without a check, that objective would silently build on the
 * old run's branches. So the first run that prepares an id claims it in the repository itself,
 * atomically: `refs/slipway-objectives/<id>` pointing at a blob that names the claiming run.
 */
import { BRANCH_PREFIX } from '../core/ids';
import { branchExists, rawGit, rawGitWithInput } from '../lib/git';

export const OBJECTIVE_CLAIM_PREFIX = 'refs/slipway-objectives';
const claimRef = (objectiveId: string) => `${OBJECTIVE_CLAIM_PREFIX}/${objectiveId}`;

/** The claim ref's blob and the objective's branches, from one `for-each-ref` over both. */
async function idRefs(repository: string, objectiveId: string): Promise<{ claim?: string; branches: string[] }> {
  const heads = `refs/heads/${BRANCH_PREFIX}/${objectiveId}/`;
  const out = await rawGit(repository, ['for-each-ref', '--format=%(objectname) %(refname)', claimRef(objectiveId), heads]);
  let claim: string | undefined;
  const branches: string[] = [];
  for (const line of out.split('\n')) {
    const space = line.indexOf(' ');
    if (space < 0) continue;
    const ref = line.slice(space + 1);
    if (ref === claimRef(objectiveId)) claim = line.slice(0, space);
    else if (ref.startsWith(heads)) branches.push(ref.slice('refs/heads/'.length));
  }
  return { claim, branches };
}

/** In words, what is in the way of the id; undefined when nothing is. */
function inUseMessage(repository: string, objectiveId: string, refs: { claim?: string; branches: string[] }): string | undefined {
  const { claim, branches } = refs;
  if (!claim && branches.length === 0) return undefined;
  const what = [claim ? `claimed by an earlier run (${claimRef(objectiveId)})` : '', branches.length ? `branches ${branches.join(', ')}` : '']
    .filter(Boolean)
    .join('; ');
  return `objective id "${objectiveId}" was used before in ${repository}: ${what}. Choose another id (--id), or remove them: ` +
    `git update-ref -d ${claimRef(objectiveId)}${branches.length ? `; git branch -D ${branches.join(' ')}` : ''}`;
}

/** What already uses `objectiveId` in `repository`, in words; undefined when it is free. */
export async function objectiveIdInUse(repository: string, objectiveId: string): Promise<string | undefined> {
  return inUseMessage(repository, objectiveId, await idRefs(repository, objectiveId));
}

export interface ClaimedBranch {
  name: string;
  commit: string;
}

/**
 * Claims `objectiveId` for the run `owner` (idempotent for the same owner). Throws, with what is
 * in the way, when another run claimed it or its branches exist without a claim. It runs at every
 * objective's start, so the reads go side by side (the refs; the claim's blob, written before it
 * is known to be needed: an unreferenced blob is harmless) and the writes in one ref transaction.
 * `branches` (possibly still being resolved; its rejection is the claim's) are made in that
 * transaction too, all or nothing (a run that lost the claim made none); when the run had claimed
 * the id already (a retried activity), each is made if absent.
 */
export async function claimObjectiveId(repository: string, objectiveId: string, owner: string, branches: PromiseLike<ClaimedBranch[]> | ClaimedBranch[] = []): Promise<void> {
  const ref = claimRef(objectiveId);
  const [refs, blob, made] = await Promise.all([idRefs(repository, objectiveId), rawGitWithInput(repository, ['hash-object', '-w', '--stdin'], `${owner}\n`).then((b) => b.trim()), branches]);
  if (refs.claim) {
    const holder = (await rawGit(repository, ['cat-file', 'blob', refs.claim])).trim();
    if (holder !== owner) throw new Error(inUseMessage(repository, objectiveId, refs) ?? `objective id "${objectiveId}" is claimed by ${holder}`);
    for (const b of made) await createBranchIfAbsent(repository, b.name, b.commit);
    return;
  }
  const inUse = inUseMessage(repository, objectiveId, refs);
  if (inUse) throw new Error(inUse);
  // Created only if absent (`create`): of two racing runs, one wins, and the loser makes nothing.
  const transaction = [`create ${ref} ${blob}`, ...made.map((b) => `create refs/heads/${b.name} ${b.commit}`)].join('\n');
  await rawGitWithInput(repository, ['update-ref', '-m', `slipway: objective ${objectiveId}`, '--stdin'], `${transaction}\n`).catch(async () => {
    const now = (await rawGit(repository, ['for-each-ref', '--format=%(objectname)', ref])).trim();
    if (now !== blob) throw new Error(`objective id "${objectiveId}" was claimed by another run at the same time`);
    // Ours after all (a retried activity whose first try committed): the branches came with it.
  });
}

/** Makes `refs/heads/<name>` at `commit` unless a branch of that name exists. */
async function createBranchIfAbsent(repository: string, name: string, commit: string): Promise<void> {
  await rawGit(repository, ['update-ref', '-m', 'slipway: integration branch', `refs/heads/${name}`, commit, '']).catch(async (e) => {
    if (!(await branchExists(repository, name))) throw e;
  });
}
