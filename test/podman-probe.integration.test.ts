/**
 * A stream's podman container removed outside Slipway while its agent runs (issue 14's probe,
 * on a host-bound provider): the stream notices (its probe after the failed step, or the sandbox
 * workflow's), recreates the container from the branch and runs the step again; the objective
 * completes. Real Temporal, real git, real podman.
 */
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { engineEnv } from '../activities/sandbox/container';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, objectiveWorkflowId, streamSandboxId, streamSandboxWorkflowId, streamWorkflowId } from '../core/ids';
import type { ObjectiveResult } from '../core/types';
import { objectiveWorkflow } from '../workflows/objective';
import { sandboxStateQuery } from '../workflows/sandbox';
import { waitFor } from './helpers/cli';
import { gitIn, makeDemoRepo } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';
import { demoObjectiveFile } from './sandbox/provider-suites';

const podman = (...args: string[]) => execFileSync('podman', args, { env: engineEnv(), encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
const containersOf = (objectiveId: string) => podman('ps', '-a', '--filter', `label=slipway.group=${objectiveId}`, '--format', '{{.Names}}').split('\n').filter(Boolean);
const PROCESSES = 'for d in /proc/[0-9]*; do tr "\\000" " " < "$d/cmdline" 2>/dev/null; echo; done';

describe('a stream container removed outside Slipway mid-run', () => {
  let worker: TestWorker;
  beforeAll(async () => {
    worker = await startTestWorker();
  });
  afterAll(async () => {
    await worker?.stop();
  });

  it('is recreated from the branch and the objective completes', async () => {
    const repo = makeDemoRepo();
    const id = `podman-probe-${randomUUID().slice(0, 6)}`;
    const file = demoObjectiveFile(repo, 'podman-probe', { provider: 'podman', network: false, probe_seconds: 2 }, {
      streams: [{ id: 'greet', task: 'Add greet(name) returning "Hello, <name>!"' }],
      agents: {
        // The objective folder is read-only in the container: the first run waits until `go` appears there.
        builder: { provider: 'script', command: 'test -f "$SLIPWAY_OBJECTIVE_DIR/go" || sleep 600; node "$SLIPWAY_OBJECTIVE_DIR/agents/builder.mjs"' },
        reviewer: { provider: 'script', command: 'node "$SLIPWAY_OBJECTIVE_DIR/agents/reviewer.mjs"' },
      },
    });
    const input = await loadObjectiveFile(file, { id });
    const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });

    const [container] = await waitFor(async () => {
      const found = containersOf(id);
      if (found.length === 0) return undefined;
      const ps = (() => {
        try {
          return podman('exec', found[0]!, '/bin/sh', '-c', PROCESSES);
        } catch {
          return '';
        }
      })();
      return ps.includes('sleep 600') ? found : undefined;
    }, 'the stream container with its agent running', 180_000);
    writeFileSync(path.join(path.dirname(file), 'go'), '');
    podman('rm', '-f', '-t', '0', container!);

    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('completed');
    expect(gitIn(repo, 'show', `${integrationBranch(id)}:src/greet.js`)).toContain('Hello, ${name}!');
    const recreate = result.ledger.find((e) => e.stream === 'greet' && e.action === 'recreate_sandbox');
    expect(recreate).toMatchObject({ kind: 'sandbox_failure', result: 'retrying' });
    expect(recreate!.summary).toContain('container_removed');
    // The stream made the new one itself (ADR 0032): no sandbox workflow, none for the replacement.
    await expect(worker.client.workflow.getHandle(streamSandboxWorkflowId(streamSandboxId(id, 'greet'))).describe()).rejects.toThrow();
    expect(await worker.client.workflow.getHandle(streamWorkflowId(id, 'greet')).query(sandboxStateQuery)).toMatchObject({ state: 'terminated' });
    expect(containersOf(id)).toEqual([]);
  }, 400_000);
});
