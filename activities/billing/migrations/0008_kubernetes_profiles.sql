-- Profiles may run their sandboxes as Kubernetes pods (ADR 0020): the worker holds the kubeconfig, never the profile.
ALTER TABLE sandbox_profiles DROP CONSTRAINT sandbox_profiles_provider_check;
ALTER TABLE sandbox_profiles ADD CONSTRAINT sandbox_profiles_provider_check CHECK (provider IN ('local', 'podman', 'docker', 'daytona', 'kubernetes'));
