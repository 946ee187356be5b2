-- Profiles may run their sandboxes in containers (ADR 0012): podman, or docker through the same code.
ALTER TABLE sandbox_profiles DROP CONSTRAINT sandbox_profiles_provider_check;
ALTER TABLE sandbox_profiles ADD CONSTRAINT sandbox_profiles_provider_check CHECK (provider IN ('local', 'podman', 'docker'));
