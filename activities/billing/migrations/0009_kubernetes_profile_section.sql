-- A kubernetes profile's own pod settings (ADR 0029): image, namespace, node selector, tolerations,
-- resources, service account, storage, warm pool; checked by ProfileKubernetesSchema before insert.
-- Null for other providers (and for kubernetes profiles made before: the worker's SLIPWAY_KUBE_* apply).
ALTER TABLE sandbox_profiles ADD COLUMN kubernetes jsonb;
