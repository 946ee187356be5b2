/**
 * Kubernetes sandboxes (`provider: kubernetes`, ADR 0020), the pure part: the objective file's
 * `kubernetes:` section, the Pod and PersistentVolumeClaim a sandbox is made of, label values,
 * and how the API server's answers map to failure kinds. No I/O here: the provider
 * (activities/sandbox/kubernetes.ts) calls the API server.
 */
import { z } from 'zod';

/** Where a pod's workspace is mounted; every command starts there. */
export const KUBE_WORKSPACE = '/workspace';
/** The pod's one container. */
export const KUBE_CONTAINER = 'sandbox';

export const KUBE_LABELS = {
  /** Every pod and claim Slipway makes carries it ("true"): the janitor's and rediscovery's selector. */
  managed: 'slipway.dev/managed',
  /** The sandbox id (a label value; the exact id is in the annotation of the same name). */
  sandbox: 'slipway.dev/sandbox',
  /** A hash of the repository's path (label values are short and path-free). */
  repository: 'slipway.dev/repository',
  /** The objective (stream sandboxes) or the project (service sandboxes): the sandbox's group. */
  group: 'slipway.dev/group',
  account: 'slipway.dev/account',
  /** Warm-pool pods: the pool's key (image and settings), and whether a create has claimed the pod. */
  pool: 'slipway.dev/pool',
  /** The pool's settings without the image: an image roll retires the older pods of the same profile. */
  poolProfile: 'slipway.dev/pool-profile',
  claimed: 'slipway.dev/claimed',
} as const;

/** A DNS-1123 name or label value: lower-case alphanumerics and '-', at most 63 characters. */
const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
export const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const QUANTITY = /^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$/;

const quantity = z.string().regex(QUANTITY, 'must be a Kubernetes quantity such as "500m", "2" or "4Gi"');
const resourceList = z.strictObject({ cpu: quantity, memory: quantity, 'ephemeral-storage': quantity }).partial();

/** The fields of the `kubernetes:` section (objective file `sandbox.kubernetes`, service profile `kubernetes`). */
const kubernetesFields = {
  /** Namespace the pods and claims go to (default: the kubeconfig context's, else `default`). */
  namespace: z.string().regex(DNS_LABEL, 'must be a DNS-1123 label (lower-case letters, digits and "-", at most 63)').max(63).optional(),
  /** The sandbox image: needs /bin/sh, git, coreutils (scripts/sandbox-image.sh builds one). */
  image: z.string().min(1).optional(),
  image_pull_policy: z.enum(['Always', 'IfNotPresent', 'Never']).optional(),
  node_selector: z.record(z.string(), z.string()).default({}),
  tolerations: z
    .array(
      z.strictObject({
        key: z.string().optional(),
        operator: z.enum(['Exists', 'Equal']).optional(),
        value: z.string().optional(),
        effect: z.enum(['NoSchedule', 'PreferNoSchedule', 'NoExecute']).optional(),
        toleration_seconds: z.number().int().optional(),
      }),
    )
    .default([]),
  resources: z.strictObject({ requests: resourceList.optional(), limits: resourceList.optional() }).optional(),
  service_account: z.string().regex(DNS_LABEL, 'must be a DNS-1123 label').optional(),
  /**
   * The workspace volume: `claim` (a PersistentVolumeClaim of `storage`, kept while suspended) or
   * `ephemeral` (an emptyDir: the sandbox cannot be suspended with its files).
   */
  workspace: z.enum(['claim', 'ephemeral']).default('claim'),
  storage: quantity.default('1Gi'),
  storage_class: z.string().optional(),
  /** Extra labels on every pod and claim. */
  labels: z.record(z.string(), z.string()).default({}),
};

const checkLabels = (k: { labels: Record<string, string> }, ctx: z.RefinementCtx) => {
  for (const [key, value] of Object.entries(k.labels)) {
    if (!LABEL_VALUE.test(value) || value.length > 63) ctx.addIssue({ code: 'custom', path: ['labels', key], message: 'must be a label value (at most 63 letters, digits, "-", "_", "."; alphanumeric at both ends)' });
    if (key.startsWith('slipway.dev/')) ctx.addIssue({ code: 'custom', path: ['labels', key], message: 'the slipway.dev/ prefix is Slipway\'s own' });
  }
};

/** The `kubernetes:` section (objective file `sandbox.kubernetes`; the warm pool is the objective's `warm_pool`). */
export const KubernetesConfigSchema = z.strictObject(kubernetesFields).superRefine(checkLabels);
/**
 * A service profile's `kubernetes:` section (ADR 0029): the same fields, and `warm_pool`, the
 * Ready pods kept per profile (ADR 0020's warm pool). Image and namespace default to the worker's
 * SLIPWAY_KUBE_IMAGE and SLIPWAY_KUBE_NAMESPACE when the section names none.
 */
export const ProfileKubernetesSchema = z.strictObject({ ...kubernetesFields, warm_pool: z.number().int().min(0).max(64).default(0) }).superRefine(checkLabels);
export type ProfileKubernetesConfig = z.output<typeof ProfileKubernetesSchema>;

/** A profile's section checked, or an Error naming the field (`kubernetes.resources.limits.memory: ...`). */
export function parseProfileKubernetes(value: unknown): ProfileKubernetesConfig {
  const r = ProfileKubernetesSchema.safeParse(value ?? {});
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  throw new Error(`${['kubernetes', ...issue.path.map(String)].join('.')}: ${issue.message}`);
}

export type KubernetesConfig = z.input<typeof KubernetesConfigSchema>;

/** The section resolved (what travels in workflow inputs: no secrets, no credentials). */
export interface KubernetesSettings {
  namespace?: string;
  image?: string;
  imagePullPolicy?: 'Always' | 'IfNotPresent' | 'Never';
  nodeSelector?: Record<string, string>;
  tolerations?: Array<{ key?: string; operator?: string; value?: string; effect?: string; tolerationSeconds?: number }>;
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  serviceAccount?: string;
  workspace?: 'claim' | 'ephemeral';
  storage?: string;
  storageClass?: string;
  labels?: Record<string, string>;
}

export function kubernetesSettingsOf(config: z.output<typeof KubernetesConfigSchema> | undefined): KubernetesSettings | undefined {
  if (!config) return undefined;
  return {
    ...(config.namespace ? { namespace: config.namespace } : {}),
    ...(config.image ? { image: config.image } : {}),
    ...(config.image_pull_policy ? { imagePullPolicy: config.image_pull_policy } : {}),
    nodeSelector: config.node_selector,
    tolerations: config.tolerations.map((t) => ({ key: t.key, operator: t.operator, value: t.value, effect: t.effect, tolerationSeconds: t.toleration_seconds })),
    ...(config.resources ? { resources: config.resources as KubernetesSettings['resources'] } : {}),
    ...(config.service_account ? { serviceAccount: config.service_account } : {}),
    workspace: config.workspace,
    storage: config.storage,
    ...(config.storage_class ? { storageClass: config.storage_class } : {}),
    labels: config.labels,
  };
}

export interface SandboxPodInput {
  /** Pod (and claim) name. */
  name: string;
  namespace: string;
  image: string;
  settings: KubernetesSettings;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  /** No network for the sandbox is not something a pod spec can say (a NetworkPolicy does); recorded only. */
  claim?: string;
}

/**
 * The sandbox's pod: one container kept alive by `sleep infinity`, every capability dropped, no
 * privilege escalation, no service-account token mounted unless a service account is named (a
 * sandbox must not reach the API server with Slipway's rights), the workspace at KUBE_WORKSPACE.
 */
export function sandboxPod(p: SandboxPodInput): object {
  const s = p.settings;
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name: p.name, namespace: p.namespace, labels: p.labels, annotations: p.annotations },
    spec: {
      restartPolicy: 'Never',
      automountServiceAccountToken: false,
      ...(s.serviceAccount ? { serviceAccountName: s.serviceAccount } : {}),
      ...(s.nodeSelector && Object.keys(s.nodeSelector).length ? { nodeSelector: s.nodeSelector } : {}),
      ...(s.tolerations?.length ? { tolerations: s.tolerations } : {}),
      terminationGracePeriodSeconds: 5,
      enableServiceLinks: false,
      containers: [
        {
          name: KUBE_CONTAINER,
          image: p.image,
          ...(s.imagePullPolicy ? { imagePullPolicy: s.imagePullPolicy } : {}),
          command: ['sleep', 'infinity'],
          workingDir: KUBE_WORKSPACE,
          ...(s.resources ? { resources: s.resources } : {}),
          securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] } },
          volumeMounts: [{ name: 'workspace', mountPath: KUBE_WORKSPACE }],
        },
      ],
      volumes: [p.claim ? { name: 'workspace', persistentVolumeClaim: { claimName: p.claim } } : { name: 'workspace', emptyDir: {} }],
    },
  };
}

export function sandboxClaim(p: { name: string; namespace: string; settings: KubernetesSettings; labels: Record<string, string>; annotations: Record<string, string> }): object {
  return {
    apiVersion: 'v1',
    kind: 'PersistentVolumeClaim',
    metadata: { name: p.name, namespace: p.namespace, labels: p.labels, annotations: p.annotations },
    spec: {
      accessModes: ['ReadWriteOnce'],
      resources: { requests: { storage: p.settings.storage ?? '1Gi' } },
      ...(p.settings.storageClass ? { storageClassName: p.settings.storageClass } : {}),
    },
  };
}

export type KubeFailureKind = 'quota' | 'rate_limit' | 'not_found' | 'transient' | 'unauthorized' | 'bad_request' | 'conflict' | 'gone' | 'other';

/**
 * What an API server answer means for Slipway: quota refusals (403 "exceeded quota"), rate
 * limits (429), server trouble (5xx: retried), missing RBAC permissions (401/403: the message
 * names the verb and resource the API server refused), not found, conflicts, 410 Gone (a watch
 * too old: re-list).
 */
export function classifyKubeStatus(status: number | undefined, message: string): { kind: KubeFailureKind; message: string } {
  if (status === 403 && /exceeded quota|forbidden: exceeded/i.test(message)) return { kind: 'quota', message };
  if (status === 401) return { kind: 'unauthorized', message: `the API server did not accept the provider's credentials (401): ${message}` };
  if (status === 403) return { kind: 'unauthorized', message: `missing RBAC permission: ${missingPermission(message) ?? message}` };
  if (status === 429) return { kind: 'rate_limit', message };
  if (status === 404) return { kind: 'not_found', message };
  if (status === 409) return { kind: 'conflict', message };
  if (status === 410) return { kind: 'gone', message };
  if (status !== undefined && status >= 500) return { kind: 'transient', message };
  return { kind: 'other', message };
}

/**
 * The RBAC verb and resource a 403's message names ("User \"u\" cannot create resource
 * \"pods/exec\" in API group \"\" in the namespace \"ns\"") as `create pods/exec in namespace ns`.
 */
export function missingPermission(message: string): string | undefined {
  const m = /cannot (\w+) resource "([^"]+)"(?: in API group "([^"]*)")?(?: in the namespace "([^"]+)")?/.exec(message);
  if (!m) return undefined;
  const [, verb, resource, group, namespace] = m;
  return `${verb} ${group ? `${resource}.${group}` : resource}${namespace ? ` in namespace ${namespace}` : ' (cluster-wide)'} (the API server said: ${message})`;
}

export interface PodLike {
  metadata?: { deletionTimestamp?: Date | string; deletionGracePeriodSeconds?: number };
  status?: {
    phase?: string;
    reason?: string;
    message?: string;
    conditions?: Array<{ type?: string; status?: string; reason?: string; message?: string; lastTransitionTime?: Date | string }>;
    containerStatuses?: Array<{ name?: string; state?: { terminated?: { reason?: string; exitCode?: number; finishedAt?: Date | string } } }>;
  };
}

/** Why a sandbox pod is no longer usable, with when it ended; undefined while it is alive. */
export function podEnd(pod: PodLike | undefined): { reason: 'oom_killed' | 'evicted' | 'deleted' | 'node_lost' | 'pod_failed'; detail: string; finishedAt?: string } | undefined {
  if (!pod) return { reason: 'deleted', detail: 'the pod was deleted outside Slipway' };
  const st = pod.status ?? {};
  const iso = (d: Date | string | undefined) => (d === undefined ? undefined : new Date(d).toISOString());
  const terminated = st.containerStatuses?.map((c) => c.state?.terminated).find((t) => t);
  if (st.reason === 'Evicted') return { reason: 'evicted', detail: `the pod was evicted: ${st.message ?? 'no message'}`, finishedAt: iso(terminated?.finishedAt) };
  if (terminated?.reason === 'OOMKilled') return { reason: 'oom_killed', detail: 'the sandbox container was killed for running out of memory (OOMKilled)', finishedAt: iso(terminated.finishedAt) };
  const ready = st.conditions?.find((c) => c.type === 'Ready');
  if (ready?.status === 'False' && ready.reason === 'NodeLost') return { reason: 'node_lost', detail: `the pod's node stopped reporting: ${ready.message ?? 'node lost'}`, finishedAt: iso(ready.lastTransitionTime) };
  if (st.phase === 'Failed' || st.phase === 'Succeeded') return { reason: 'pod_failed', detail: `the pod ended (${st.phase}${terminated?.reason ? `, ${terminated.reason}` : ''}${terminated?.exitCode !== undefined ? `, exit ${terminated.exitCode}` : ''})`, finishedAt: iso(terminated?.finishedAt) };
  if (pod.metadata?.deletionTimestamp) return { reason: 'deleted', detail: 'the pod is being deleted outside Slipway', finishedAt: podDeletedAt(pod) };
  return undefined;
}

/**
 * When a pod's deletion was asked (ISO): the API server sets deletionTimestamp to that moment plus
 * the grace period (when the pod must be gone), so the grace is taken off; undefined for a pod
 * removed at once (no timestamp).
 */
export function podDeletedAt(pod: PodLike): string | undefined {
  const at = pod.metadata?.deletionTimestamp;
  if (at === undefined) return undefined;
  return new Date(new Date(at).getTime() - (pod.metadata?.deletionGracePeriodSeconds ?? 0) * 1000).toISOString();
}

/** The scheduler's refusal of a pending pod ("0/1 nodes are available: ..."), if it gave one. */
export function unschedulable(pod: PodLike | undefined): string | undefined {
  const c = pod?.status?.conditions?.find((x) => x.type === 'PodScheduled');
  return c?.status === 'False' && c.reason === 'Unschedulable' ? c.message ?? 'unschedulable' : undefined;
}

export const podReady = (pod: PodLike | undefined) => pod?.status?.phase === 'Running' && pod.status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') === true;
