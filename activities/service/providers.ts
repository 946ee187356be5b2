/**
 * Provider instances for service sandboxes, one per distinct provider and confinement setting, shared by
 * the API (exec and files run straight against the provider) and the worker (lifecycle).
 */
import { ContainerSandboxProvider } from '../sandbox/container';
import { DaytonaSandboxProvider, type DaytonaProviderOptions } from '../sandbox/daytona';
import { KubernetesSandboxProvider, type KubernetesProviderOptions } from '../sandbox/kubernetes';
import { LocalSandboxProvider } from '../sandbox/local';
import type { SandboxProvider } from '../sandbox/provider';
import type { SandboxPolicy } from '../../core/sandbox-service';

export type ProviderPolicy = Pick<SandboxPolicy, 'provider' | 'confinement' | 'network' | 'copyIgnored' | 'limits'>;
export type ProviderFor = (policy: ProviderPolicy) => SandboxProvider;

/** `daytona`: connection settings for daytona profiles (default: DAYTONA_* from the worker's environment). */
/** `kubernetes`: the cluster and pod settings for kubernetes profiles (default: KUBECONFIG, SLIPWAY_KUBE_IMAGE, SLIPWAY_KUBE_NAMESPACE from the worker's environment). */
export function defaultProviderFor(options: { daytona?: DaytonaProviderOptions; kubernetes?: KubernetesProviderOptions } = {}): ProviderFor {
  const cache = new Map<string, SandboxProvider>();
  return (policy) => {
    const key = `${policy.provider}:${policy.confinement}:${policy.network}:${policy.copyIgnored}:${JSON.stringify(policy.limits ?? {})}`;
    let provider = cache.get(key);
    if (!provider && (policy.provider === 'podman' || policy.provider === 'docker')) {
      // The container is the confinement: a profile's bubblewrap setting does not apply to it.
      provider = new ContainerSandboxProvider({ engine: policy.provider, defaults: { network: policy.network, ...(policy.limits ? { limits: policy.limits } : {}) } });
      cache.set(key, provider);
    }
    if (!provider && policy.provider === 'daytona') {
      // Daytona's sandbox is the confinement; the key stays in the worker (never in the profile or history).
      provider = new DaytonaSandboxProvider({ ...(options.daytona ?? { snapshot: process.env.DAYTONA_SNAPSHOT }), network: policy.network });
      cache.set(key, provider);
    }
    if (!provider && policy.provider === 'kubernetes') {
      // The pod is the confinement; the profile's limits size it (requests = limits).
      const base = options.kubernetes ?? { defaults: { image: process.env.SLIPWAY_KUBE_IMAGE, ...(process.env.SLIPWAY_KUBE_NAMESPACE ? { namespace: process.env.SLIPWAY_KUBE_NAMESPACE } : {}) } };
      const limits: Record<string, string> = {};
      if (policy.limits?.memoryBytes) limits.memory = String(policy.limits.memoryBytes);
      if (policy.limits?.cpus) limits.cpu = String(policy.limits.cpus);
      provider = new KubernetesSandboxProvider({ ...base, defaults: { ...base.defaults, ...(Object.keys(limits).length ? { resources: { requests: limits, limits } } : {}) } });
      cache.set(key, provider);
    }
    if (!provider) {
      provider = new LocalSandboxProvider({
        copyIgnored: policy.copyIgnored,
        confinement: policy.confinement === 'bubblewrap' ? { kind: 'bubblewrap', network: policy.network, ...(policy.limits ? { limits: policy.limits } : {}) } : undefined,
      });
      cache.set(key, provider);
    }
    return provider;
  };
}

/**
 * A service sandbox's commands see SANDBOX_BASE_ENV plus what the caller passed, and never the
 * server's own (DATABASE_URL, tokens): exec runs with `inheritEnv: false`, so the values travel
 * in the process environment, not in argv.
 */
export { SANDBOX_BASE_ENV } from '../sandbox/provider';
