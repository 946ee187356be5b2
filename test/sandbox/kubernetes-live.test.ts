/**
 * The sandbox contract against a real Kubernetes cluster (ADR 0020). Runs when SLIPWAY_KUBE_LIVE=1
 * and KUBECONFIG points at the cluster (SLIPWAY_KUBE_NAMESPACE, default the context's; and
 * SLIPWAY_KUBE_IMAGE, an image with /bin/sh, git and coreutils the cluster can pull); skipped
 * otherwise, saying so: the one skip allowed, because it needs a cluster, not a tool. Needs the
 * Role of infra/kubernetes/rbac.yaml (or more) in that namespace.
 *
 *   SLIPWAY_KUBE_LIVE=1 KUBECONFIG=~/.kube/config SLIPWAY_KUBE_IMAGE=ghcr.io/acme/sandbox:1 npx vitest run test/sandbox/kubernetes-live.test.ts
 */
import { describe, it } from 'vitest';
import { KubernetesSandboxProvider } from '../../activities/sandbox/kubernetes';
import { KUBE_WORKSPACE } from '../../core/kubernetes';
import { describeSandboxContract } from './contract';

const live = process.env.SLIPWAY_KUBE_LIVE === '1' && !!process.env.KUBECONFIG;

if (live) {
  const make = () => new KubernetesSandboxProvider({ defaults: { ...(process.env.SLIPWAY_KUBE_NAMESPACE ? { namespace: process.env.SLIPWAY_KUBE_NAMESPACE } : {}), image: process.env.SLIPWAY_KUBE_IMAGE } });
  // Processes run in the cluster's pods: the suite's process check asks the suite's sandboxes themselves.
  const probe = make();
  describeSandboxContract('kubernetes (live)', make, {
    processRunning: (marker) => probe.processRunningInAny(marker),
    workspacePath: async () => KUBE_WORKSPACE,
  });
} else {
  console.warn('kubernetes (live): skipped, SLIPWAY_KUBE_LIVE=1 and KUBECONFIG are not both set');
  describe('kubernetes (live)', () => {
    it.skip('skipped: set SLIPWAY_KUBE_LIVE=1 and KUBECONFIG (and SLIPWAY_KUBE_IMAGE, optionally SLIPWAY_KUBE_NAMESPACE) to run the sandbox contract against a real cluster', () => undefined);
  });
}
