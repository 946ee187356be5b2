/**
 * The environment bwrap gives a confined command (ADR 0027): NUL-separated options read from a
 * pipe (`--args FD`). A NUL inside a name or value would become an option boundary, so a tenant
 * could append `--bind / /host`: refused, naming the variable.
 */
import { describe, expect, it } from 'vitest';
import { bwrapEnvOptions, HOST_HELPER_ENV } from '../../activities/sandbox/exec';

describe('bwrapEnvOptions', () => {
  it('clears the environment, then sets each variable as given (newlines, quotes, "=" in values)', () => {
    const env = { A: 'x=y', MULTI: "line one\nline 'two' $HOME", EMPTY: '' };
    const parts = bwrapEnvOptions(env).toString().split('\0');
    expect(parts.pop()).toBe(''); // every option ends with NUL
    expect(parts).toEqual(['--clearenv', '--setenv', 'A', 'x=y', '--setenv', 'MULTI', env.MULTI, '--setenv', 'EMPTY', '']);
  });

  it('refuses a NUL in a value or a name, and "=" or nothing as a name, naming the variable', () => {
    expect(() => bwrapEnvOptions({ EVIL: 'x\0--bind\0/\0/host' })).toThrow(/environment variable EVIL: its value contains a NUL byte/);
    expect(() => bwrapEnvOptions({ 'A\0--bind': 'x' })).toThrow(/environment variable "A\\u0000--bind"/);
    expect(() => bwrapEnvOptions({ 'A=B': 'x' })).toThrow(/environment variable "A=B": a name must be non-empty, without "=" or NUL/);
    expect(() => bwrapEnvOptions({ '': 'x' })).toThrow(/a name must be non-empty/);
  });

  it("the host-side helpers' environment is Slipway's: PATH only", () => {
    expect(Object.keys(HOST_HELPER_ENV)).toEqual(['PATH']);
  });
});
