/**
 * The seccomp filter generator (activities/sandbox/seccomp.ts), table-tested by running the
 * assembled program in a small classic-BPF interpreter over seccomp_data inputs: every denied
 * call on each architecture, the argument-decided ones, ordinary calls, and foreign architectures.
 * That the kernel agrees is shown in attacks.test.ts ("a seccomp filter denies ...").
 */
import { describe, expect, it } from 'vitest';
import { assemble, AUDIT_ARCH, DENIED_SYSCALLS, SECCOMP_RET, seccompFilter, seccompInstructions, type SeccompArch } from '../../activities/sandbox/seccomp';

/** Runs a cBPF program (only the opcodes seccomp programs use) on struct seccomp_data. */
function run(program: Buffer, data: { arch: number; nr: number; args?: number[] }): number {
  const mem = Buffer.alloc(64);
  mem.writeInt32LE(data.nr, 0);
  mem.writeUInt32LE(data.arch >>> 0, 4);
  (data.args ?? []).forEach((a, i) => mem.writeBigUInt64LE(BigInt(a), 16 + 8 * i));
  let acc = 0;
  for (let pc = 0, steps = 0; pc * 8 < program.length && steps < 10_000; steps++) {
    const code = program.readUInt16LE(pc * 8);
    const jt = program.readUInt8(pc * 8 + 2);
    const jf = program.readUInt8(pc * 8 + 3);
    const k = program.readUInt32LE(pc * 8 + 4);
    switch (code) {
      case 0x20:
        acc = mem.readUInt32LE(k);
        pc++;
        break;
      case 0x15:
        pc += 1 + (acc === k ? jt : jf);
        break;
      case 0x35:
        pc += 1 + (acc >= k ? jt : jf);
        break;
      case 0x45:
        pc += 1 + ((acc & k) !== 0 ? jt : jf);
        break;
      case 0x06:
        return k;
      default:
        throw new Error(`unexpected opcode ${code.toString(16)} at ${pc}`);
    }
  }
  throw new Error('the program fell off its end');
}

const program = assemble(seccompInstructions());
const EPERM = SECCOMP_RET.ERRNO | 1;
const ENOSYS = SECCOMP_RET.ERRNO | 38;
const ARCHES = Object.keys(AUDIT_ARCH) as SeccompArch[];
const NR = {
  read: { x86_64: 0, aarch64: 63 },
  openat: { x86_64: 257, aarch64: 56 },
  execve: { x86_64: 59, aarch64: 221 },
  clone: { x86_64: 56, aarch64: 220 },
  clone3: { x86_64: 435, aarch64: 435 },
  unshare: { x86_64: 272, aarch64: 97 },
  ioctl: { x86_64: 16, aarch64: 29 },
};
const CLONE_THREAD_FLAGS = 0x3d0f00; // what pthread_create passes
const CLONE_NEWUSER = 0x10000000;

describe('seccomp filter', () => {
  it('is a valid program: every jump in range, ends on a return, the same bytes every time', () => {
    expect(program.length % 8).toBe(0);
    expect(program.length / 8).toBeLessThanOrEqual(4096); // BPF_MAXINSNS
    expect(seccompFilter('x64')).toEqual(program);
    expect(seccompFilter('arm64')).toEqual(program);
    expect(seccompFilter('ia32')).toBeUndefined();
  });

  describe.each(ARCHES)('%s', (arch) => {
    const call = (nr: number, args: number[] = []) => run(program, { arch: AUDIT_ARCH[arch], nr, args });

    it.each(DENIED_SYSCALLS.map((s) => [s.name, s[arch]] as const))('denies %s (%i) with EPERM', (_name, nr) => {
      expect(call(nr)).toBe(EPERM);
    });

    it.each([
      ['read', NR.read[arch], [], SECCOMP_RET.ALLOW],
      ['openat', NR.openat[arch], [], SECCOMP_RET.ALLOW],
      ['execve', NR.execve[arch], [], SECCOMP_RET.ALLOW],
      ['clone of a thread', NR.clone[arch], [CLONE_THREAD_FLAGS], SECCOMP_RET.ALLOW],
      ['clone of a process (SIGCHLD)', NR.clone[arch], [17], SECCOMP_RET.ALLOW],
      ['clone with CLONE_NEWUSER', NR.clone[arch], [CLONE_NEWUSER | 17], EPERM],
      ['unshare(CLONE_NEWUSER | CLONE_NEWNS)', NR.unshare[arch], [CLONE_NEWUSER | 0x20000], EPERM],
      ['unshare(CLONE_FILES)', NR.unshare[arch], [0x400], SECCOMP_RET.ALLOW],
      ['clone3 (libc falls back to clone)', NR.clone3[arch], [], ENOSYS],
      ['ioctl TIOCSTI', NR.ioctl[arch], [0, 0x5412], EPERM],
      ['ioctl TIOCSTI with high bits set (the kernel ignores them)', NR.ioctl[arch], [0, 0x1_0000_5412], EPERM],
      ['ioctl TIOCLINUX', NR.ioctl[arch], [0, 0x541c], EPERM],
      ['ioctl TCGETS', NR.ioctl[arch], [0, 0x5401], SECCOMP_RET.ALLOW],
      ['ioctl FIONREAD', NR.ioctl[arch], [0, 0x541b], SECCOMP_RET.ALLOW],
    ] as Array<[string, number, number[], number]>)('%s', (_what, nr, args, expected) => {
      expect(call(nr, args)).toBe(expected);
    });
  });

  it('kills x32 system calls on x86_64 and every call of a foreign architecture', () => {
    expect(run(program, { arch: AUDIT_ARCH.x86_64, nr: 0x40000000 | 250 })).toBe(SECCOMP_RET.KILL_PROCESS);
    expect(run(program, { arch: AUDIT_ARCH.x86_64, nr: 0x40000000 })).toBe(SECCOMP_RET.KILL_PROCESS);
    for (const foreign of [0x40000003 /* i386 */, 0x40000028 /* arm */, 0xc00000f3 /* riscv64 */, 0]) {
      expect(run(program, { arch: foreign, nr: 0 })).toBe(SECCOMP_RET.KILL_PROCESS);
    }
  });

  it('lists each denied call once, with the same number on both architectures from 424 on', () => {
    const names = DENIED_SYSCALLS.map((s) => s.name);
    expect(new Set(names).size).toBe(names.length);
    for (const s of DENIED_SYSCALLS) if (s.x86_64 >= 424 || s.aarch64 >= 424) expect(s.x86_64).toBe(s.aarch64);
  });
});
