/**
 * The streams of an objective as a graph: how many there may be, unique ids, known
 * dependencies, no cycles. One check for the objective file, the planner's answer and the
 * objective workflow (which takes nothing from an activity on trust). Free of zod so the
 * workflow bundle can use it.
 */

/**
 * Most streams one objective may have, from the file or from the planner. It bounds the
 * objective's history (docs/adr/0009-bounded-objective-history.md works out the worst case).
 */
export const MAX_STREAMS = 64;

export interface StreamNode {
  id: string;
  depends_on: string[];
}

export interface StreamGraphIssue {
  /** Path below the objective, like zod's: `['streams', 1, 'depends_on', 0]`. */
  path: (string | number)[];
  message: string;
}

/** Everything wrong with a list of streams, each at the field it is about; empty when fine. */
export function streamGraphIssues(streams: StreamNode[]): StreamGraphIssue[] {
  const issues: StreamGraphIssue[] = [];
  if (streams.length > MAX_STREAMS) {
    issues.push({ path: ['streams'], message: `too many streams: ${streams.length}, at most ${MAX_STREAMS} allowed; split the objective into several` });
  }
  const ids = new Set<string>();
  streams.forEach((stream, index) => {
    if (ids.has(stream.id)) issues.push({ path: ['streams', index, 'id'], message: `duplicate stream id "${stream.id}"` });
    ids.add(stream.id);
  });
  streams.forEach((stream, index) => {
    stream.depends_on.forEach((dep, depIndex) => {
      if (!ids.has(dep)) issues.push({ path: ['streams', index, 'depends_on', depIndex], message: `unknown stream "${dep}"` });
      else if (dep === stream.id) issues.push({ path: ['streams', index, 'depends_on', depIndex], message: 'a stream cannot depend on itself' });
    });
  });
  const cycle = findDependencyCycle(streams);
  if (cycle) {
    const index = streams.findIndex((s) => s.id === cycle[0]);
    issues.push({ path: ['streams', index, 'depends_on'], message: `dependency cycle: ${cycle.join(' -> ')}` });
  }
  return issues;
}

/** `streams[1].depends_on[0]`, the way the CLI names fields. */
export function formatIssuePath(path: (string | number)[]): string {
  return path.map((p, i) => (typeof p === 'number' ? `[${p}]` : i === 0 ? p : `.${p}`)).join('');
}

/** Returns one dependency cycle as a list of stream ids (first repeated at the end), or undefined. */
export function findDependencyCycle(streams: StreamNode[]): string[] | undefined {
  const deps = new Map(streams.map((s) => [s.id, s.depends_on.filter((d) => d !== s.id)]));
  const state = new Map<string, 'visiting' | 'done'>();
  const stack: string[] = [];
  const visit = (node: string): string[] | undefined => {
    if (state.get(node) === 'done') return undefined;
    if (state.get(node) === 'visiting') return [...stack.slice(stack.indexOf(node)), node];
    state.set(node, 'visiting');
    stack.push(node);
    for (const dep of deps.get(node) ?? []) {
      const found = deps.has(dep) ? visit(dep) : undefined;
      if (found) return found;
    }
    stack.pop();
    state.set(node, 'done');
    return undefined;
  };
  for (const s of streams) {
    const found = visit(s.id);
    if (found) return found;
  }
  return undefined;
}
