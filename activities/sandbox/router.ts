/**
 * One SandboxProvider in front of several: create picks the provider the request names
 * (`provider`, default local); every later call on a sandbox goes to the provider that owns its
 * root (a container sandbox's root is `<repo>/.slipway/containers/...`, ADR 0012), so a handle
 * needs no more than its root, as before. Container providers are made on first use.
 */
import path from 'node:path';
import { ContainerSandboxProvider, parseContainerRoot, readContainerRecord, type ContainerEngine } from './container';
import { DaytonaSandboxProvider, parseDaytonaRoot } from './daytona';
import { KubernetesSandboxProvider, parseKubernetesRoot } from './kubernetes';
import { PortUnreachableError } from './port-relay';
import type { FileIoOptions } from './file-io';
import type { ExecRequest, SandboxCreateRequest, SandboxHandle, SandboxProvider, SessionRequest } from './provider';

export class SandboxProviders implements SandboxProvider {
  readonly kind = 'router';
  /** Per sandbox: `provider(kind).hostBound` says whether its owner is one worker. */
  readonly hostBound = true;
  private readonly containers = new Map<ContainerEngine, SandboxProvider>();
  private daytona?: SandboxProvider;
  private kubernetes?: SandboxProvider;

  constructor(
    readonly local: SandboxProvider,
    private readonly makeContainer: (engine: ContainerEngine) => SandboxProvider = (engine) => new ContainerSandboxProvider({ engine }),
    // Credentials come from the worker's environment when the provider is first used (ADR 0019).
    private readonly makeDaytona: () => SandboxProvider = () => new DaytonaSandboxProvider({ snapshot: process.env.DAYTONA_SNAPSHOT }),
    // The cluster comes from the worker's KUBECONFIG (or its in-cluster service account) on first use (ADR 0020).
    private readonly makeKubernetes: () => SandboxProvider = () => new KubernetesSandboxProvider(),
  ) {}

  /** The provider of a kind (`local`, `podman`, `docker`). */
  provider(kind: string | undefined): SandboxProvider {
    if (!kind || kind === 'local') return this.local;
    if (kind === 'daytona') return (this.daytona ??= this.makeDaytona());
    if (kind === 'kubernetes') return (this.kubernetes ??= this.makeKubernetes());
    if (kind !== 'podman' && kind !== 'docker') throw new Error(`unknown sandbox provider "${kind}" (known: local, podman, docker, daytona, kubernetes)`);
    let p = this.containers.get(kind);
    if (!p) this.containers.set(kind, (p = this.makeContainer(kind)));
    return p;
  }

  /**
   * The provider that owns a sandbox root. A container sandbox's engine is the one its record
   * names (the record Slipway wrote beside the workspace, never anything from the container);
   * records from before the engine was kept, and roots with no record, are podman's.
   */
  private async owner(root: string): Promise<SandboxProvider> {
    if (parseDaytonaRoot(path.resolve(root))) return this.provider('daytona');
    if (parseKubernetesRoot(path.resolve(root))) return this.provider('kubernetes');
    if (!parseContainerRoot(path.resolve(root))) return this.local;
    const engine = (await readContainerRecord(root))?.engine;
    return this.provider(engine === 'docker' ? 'docker' : 'podman');
  }

  create(req: SandboxCreateRequest): Promise<SandboxHandle> {
    return this.provider(req.provider).create(req);
  }
  async exec(handle: Pick<SandboxHandle, 'root'>, req: ExecRequest) {
    return (await this.owner(handle.root)).exec(handle, req);
  }
  async openSession(handle: Pick<SandboxHandle, 'root'>, req: SessionRequest) {
    return (await this.owner(handle.root)).openSession(handle, req);
  }
  async connectPort(handle: Pick<SandboxHandle, 'root'>, port: number) {
    const p = await this.owner(handle.root);
    if (!p.connectPort) throw new PortUnreachableError(port, `the ${p.kind} provider cannot reach a sandbox's ports yet`);
    return p.connectPort(handle, port);
  }
  async agentHome(handle: Pick<SandboxHandle, 'root'>) {
    return (await this.owner(handle.root)).agentHome?.(handle);
  }
  async readFile(handle: Pick<SandboxHandle, 'root'>, file: string, opts?: FileIoOptions) {
    return (await this.owner(handle.root)).readFile(handle, file, opts);
  }
  async openFile(handle: Pick<SandboxHandle, 'root'>, file: string, opts?: FileIoOptions) {
    return (await this.owner(handle.root)).openFile(handle, file, opts);
  }
  async writeFile(handle: Pick<SandboxHandle, 'root'>, file: string, content: Buffer | string, opts?: FileIoOptions) {
    return (await this.owner(handle.root)).writeFile(handle, file, content, opts);
  }
  async deleteFile(handle: Pick<SandboxHandle, 'root'>, file: string, opts?: FileIoOptions) {
    return (await this.owner(handle.root)).deleteFile(handle, file, opts);
  }
  async listFiles(handle: Pick<SandboxHandle, 'root'>, file: string, opts?: FileIoOptions) {
    return (await this.owner(handle.root)).listFiles(handle, file, opts);
  }
  async destroy(request: { repository: string; root: string }) {
    return (await this.owner(request.root)).destroy(request);
  }
  async collect(handle: Pick<SandboxHandle, 'root'>, options?: { known?: string[]; signal?: AbortSignal }) {
    return (await this.owner(handle.root)).collect(handle, options);
  }
  async list(repository: string) {
    const lists = await Promise.all([this.local, ...this.containers.values(), ...(this.daytona ? [this.daytona] : []), ...(this.kubernetes ? [this.kubernetes] : [])].map((p) => p.list(repository)));
    return lists.flat();
  }
  async suspend(handle: Pick<SandboxHandle, 'root'>, options: { templateIgnored: boolean }) {
    const p = await this.owner(handle.root);
    if (!p.suspend) throw new Error(`the ${p.kind} provider cannot suspend sandboxes`);
    return p.suspend(handle, options);
  }
  async restore(handle: Pick<SandboxHandle, 'root'>, options: { templateIgnored: boolean }) {
    const p = await this.owner(handle.root);
    if (!p.restore) throw new Error(`the ${p.kind} provider cannot restore sandboxes`);
    return p.restore(handle, options);
  }
  async deleteSnapshot(handle: Pick<SandboxHandle, 'root'>) {
    await (await this.owner(handle.root)).deleteSnapshot?.(handle);
  }
  async bringCommits(handle: Pick<SandboxHandle, 'root'>, commits: string[]) {
    await (await this.owner(handle.root)).bringCommits?.(handle, commits);
  }
  async probe(handle: Pick<SandboxHandle, 'root'>) {
    const p = await this.owner(handle.root);
    return (await p.probe?.(handle)) ?? { alive: true as const };
  }
}
