/**
 * Classifies an objective's `repository:` value: a remote URL (https, ssh, scp-like
 * `git@host:path`, file) or a filesystem path. Pure, so the refusal of embedded credentials
 * is decided in one place and never depends on git or the network.
 *
 * Why refuse credentials: the value lands in workflow input and history (ADR 0012, secrets
 * never enter history); authentication belongs to a git credential helper or the environment.
 */

export type RepositoryUrlProtocol = 'https' | 'http' | 'ssh' | 'git' | 'file';

export type RepositorySpec =
  | { kind: 'path'; path: string }
  | { kind: 'url'; protocol: RepositoryUrlProtocol; url: string; hasCredentials: boolean; display: string };

const SCHEME = /^([a-z][a-z0-9+.-]*):\/\//i;
// `user@host:path` (scp-like ssh); not a Windows drive (`C:\`) and no `//` after the colon.
const SCP_LIKE = /^(?:[^@/:\s]+@)?[^@/:\s]+:(?!\/\/)/;
const PROTOCOLS: readonly RepositoryUrlProtocol[] = ['https', 'http', 'ssh', 'git', 'file'];

export class RepositorySpecError extends Error {}

export function classifyRepositorySpec(spec: string): RepositorySpec {
  const scheme = SCHEME.exec(spec);
  if (scheme) {
    const protocol = scheme[1]!.toLowerCase();
    if (!(PROTOCOLS as readonly string[]).includes(protocol)) {
      throw new RepositorySpecError(`unsupported URL scheme "${protocol}://" (expected one of: ${PROTOCOLS.map((p) => `${p}://`).join(', ')}, or a path)`);
    }
    let parsed: URL;
    try {
      parsed = new URL(spec);
    } catch {
      throw new RepositorySpecError(`not a valid ${protocol} URL`);
    }
    // A password (or an https/http user name, which git treats as a token holder) is a secret.
    const hasCredentials = parsed.password !== '' || ((protocol === 'https' || protocol === 'http') && parsed.username !== '');
    return { kind: 'url', protocol: protocol as RepositoryUrlProtocol, url: spec, hasCredentials, display: redactUrl(parsed) };
  }
  if (SCP_LIKE.test(spec) && !spec.startsWith('/') && !spec.startsWith('.') && !spec.startsWith('~')) {
    return { kind: 'url', protocol: 'ssh', url: spec, hasCredentials: false, display: spec };
  }
  return { kind: 'path', path: spec };
}

/** The URL with any user name and password removed, safe for messages and logs. */
function redactUrl(url: URL): string {
  const copy = new URL(url.href);
  copy.username = '';
  copy.password = '';
  return copy.href;
}
