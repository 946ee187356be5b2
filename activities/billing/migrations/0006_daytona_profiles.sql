-- Profiles may run their sandboxes on Daytona (ADR 0019): the worker holds the API key, never the profile.
ALTER TABLE sandbox_profiles DROP CONSTRAINT sandbox_profiles_provider_check;
ALTER TABLE sandbox_profiles ADD CONSTRAINT sandbox_profiles_provider_check CHECK (provider IN ('local', 'podman', 'docker', 'daytona'));
