/**
 * A service profile's `kubernetes:` section (ADR 0029): checked with zod, errors naming the field;
 * what the policy carries from it (the pods' settings, the warm pool), and the worker's
 * SLIPWAY_KUBE_* only as defaults. Pure: no database, no cluster.
 */
import { describe, expect, it } from 'vitest';
import { policyFromProfile, type ProfileRow } from '../activities/billing/records';
import { parseProfileKubernetes } from '../core/kubernetes';

const row = (over: Partial<ProfileRow>): ProfileRow => ({
  id: 'prf_1', account_id: 'a', name: 'k', kind: 'sandbox', provider: 'kubernetes', platform: 'linux', resources: {}, repository: '/r', base_ref: 'main',
  copy_ignored: false, confinement: 'bubblewrap', network: false, idle_timeout_seconds: 60, provisioning_timeout_seconds: 120, default_deadline_minutes: 60,
  max_deadline_minutes: 600, absolute_cap_minutes: 6000, warm_replicas: 0, kubernetes: null, created_at: new Date(), ...over,
});

describe('the profile kubernetes section', () => {
  it.each([
    [{ namespace: 'Bad_NS' }, /^kubernetes\.namespace: must be a DNS-1123 label/],
    [{ resources: { limits: { memory: 'lots' } } }, /^kubernetes\.resources\.limits\.memory: must be a Kubernetes quantity/],
    [{ resources: { limits: { gpu: '1' } } }, /^kubernetes\.resources\.limits: .*gpu/],
    [{ tolerations: [{ key: 'pool', effect: 'Sometimes' }] }, /^kubernetes\.tolerations\.0\.effect: /],
    [{ node_selector: { pool: 3 } }, /^kubernetes\.node_selector\.pool: /],
    [{ service_account: 'Not A Name' }, /^kubernetes\.service_account: must be a DNS-1123 label/],
    [{ storage: '10 gigs' }, /^kubernetes\.storage: must be a Kubernetes quantity/],
    [{ warm_pool: -1 }, /^kubernetes\.warm_pool: /],
    [{ warm_pool: 1.5 }, /^kubernetes\.warm_pool: /],
    [{ labels: { 'slipway.dev/sandbox': 'x' } }, /^kubernetes\.labels\.slipway\.dev\/sandbox: the slipway\.dev\/ prefix/],
    [{ imagee: 'typo' }, /^kubernetes: .*imagee/],
  ])('refuses %j naming the field', (section, message) => {
    expect(() => parseProfileKubernetes(section)).toThrow(message);
  });

  it('accepts the full section and the policy carries the settings and warm pool; none when the column is empty', () => {
    const section = {
      image: 'ghcr.io/acme/sandbox:1', namespace: 'sandboxes', node_selector: { pool: 'sandbox' },
      tolerations: [{ key: 'pool', operator: 'Equal', value: 'sandbox', effect: 'NoSchedule' }],
      resources: { requests: { cpu: '500m', memory: '1Gi' }, limits: { cpu: '2', memory: '4Gi' } },
      service_account: 'sandbox-runner', storage: '10Gi', storage_class: 'fast', warm_pool: 2,
    };
    expect(() => parseProfileKubernetes(section)).not.toThrow();
    expect(policyFromProfile(row({ kubernetes: section })).kubernetes).toEqual({
      warmPool: 2,
      settings: {
        image: 'ghcr.io/acme/sandbox:1', namespace: 'sandboxes', nodeSelector: { pool: 'sandbox' },
        tolerations: [{ key: 'pool', operator: 'Equal', value: 'sandbox', effect: 'NoSchedule', tolerationSeconds: undefined }],
        resources: { requests: { cpu: '500m', memory: '1Gi' }, limits: { cpu: '2', memory: '4Gi' } },
        serviceAccount: 'sandbox-runner', workspace: 'claim', storage: '10Gi', storageClass: 'fast', labels: {},
      },
    });
    // No section: nothing, so the worker's SLIPWAY_KUBE_IMAGE / SLIPWAY_KUBE_NAMESPACE apply.
    expect(policyFromProfile(row({})).kubernetes).toBeUndefined();
    expect(policyFromProfile(row({ provider: 'local', kubernetes: section })).kubernetes).toBeUndefined();
  });
});
