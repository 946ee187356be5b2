/**
 * The seccomp filter of bubblewrap sandboxes (`bwrap --seccomp FD`), as a classic BPF program
 * generated here: no maintained npm package produces one and nothing native can be built (ADR
 * 0006, section 10). It denies, with EPERM, the system calls a sandbox never needs and that widen
 * the kernel's attack surface; everything else is allowed. The program checks the architecture
 * first: x86_64 and aarch64 have their own tables, any other architecture (i386 or x32 system
 * calls made from an x86_64 process included) kills the process.
 */

/** AUDIT_ARCH_* values (linux/audit.h). */
export const AUDIT_ARCH = { x86_64: 0xc000003e, aarch64: 0xc00000b7 } as const;
export type SeccompArch = keyof typeof AUDIT_ARCH;

/** x32 system calls carry this bit in their number on x86_64. */
const X32_SYSCALL_BIT = 0x40000000;
const CLONE_NEWUSER = 0x10000000;
/** ioctls that push input into a terminal (TIOCSTI) or drive the console (TIOCLINUX). */
const TIOCSTI = 0x5412;
const TIOCLINUX = 0x541c;

export const SECCOMP_RET = { KILL_PROCESS: 0x80000000, ERRNO: 0x00050000, ALLOW: 0x7fff0000 } as const;
const EPERM = 1;
const ENOSYS = 38;

/**
 * Denied outright, with why, and the numbers on each architecture (asm/unistd_64.h and
 * asm-generic/unistd.h; numbers from 424 on are the same everywhere).
 */
export const DENIED_SYSCALLS: ReadonlyArray<{ name: string; x86_64: number; aarch64: number; why: string }> = [
  { name: 'keyctl', x86_64: 250, aarch64: 219, why: 'kernel keyrings are not namespaced' },
  { name: 'add_key', x86_64: 248, aarch64: 217, why: 'kernel keyrings are not namespaced' },
  { name: 'request_key', x86_64: 249, aarch64: 218, why: 'kernel keyrings are not namespaced' },
  { name: 'bpf', x86_64: 321, aarch64: 280, why: 'eBPF verifier and maps: a frequent source of kernel bugs' },
  { name: 'perf_event_open', x86_64: 298, aarch64: 241, why: 'performance counters: kernel attack surface and side channels' },
  { name: 'userfaultfd', x86_64: 323, aarch64: 282, why: 'used to widen race windows in kernel exploits' },
  { name: 'kexec_load', x86_64: 246, aarch64: 104, why: 'loads a new kernel' },
  { name: 'kexec_file_load', x86_64: 320, aarch64: 294, why: 'loads a new kernel' },
  { name: 'init_module', x86_64: 175, aarch64: 105, why: 'kernel modules' },
  { name: 'finit_module', x86_64: 313, aarch64: 273, why: 'kernel modules' },
  { name: 'delete_module', x86_64: 176, aarch64: 106, why: 'kernel modules' },
  { name: 'mount', x86_64: 165, aarch64: 40, why: 'the mounts are bubblewrap\'s' },
  { name: 'umount2', x86_64: 166, aarch64: 39, why: 'the mounts are bubblewrap\'s' },
  { name: 'pivot_root', x86_64: 155, aarch64: 41, why: 'the mounts are bubblewrap\'s' },
  { name: 'open_tree', x86_64: 428, aarch64: 428, why: 'the new mount API' },
  { name: 'move_mount', x86_64: 429, aarch64: 429, why: 'the new mount API' },
  { name: 'fsopen', x86_64: 430, aarch64: 430, why: 'the new mount API' },
  { name: 'fsconfig', x86_64: 431, aarch64: 431, why: 'the new mount API' },
  { name: 'fsmount', x86_64: 432, aarch64: 432, why: 'the new mount API' },
  { name: 'fspick', x86_64: 433, aarch64: 433, why: 'the new mount API' },
  { name: 'mount_setattr', x86_64: 442, aarch64: 442, why: 'the new mount API' },
  { name: 'swapon', x86_64: 167, aarch64: 224, why: 'host administration' },
  { name: 'swapoff', x86_64: 168, aarch64: 225, why: 'host administration' },
  { name: 'reboot', x86_64: 169, aarch64: 142, why: 'host administration' },
  { name: 'acct', x86_64: 163, aarch64: 89, why: 'host administration' },
  { name: 'quotactl', x86_64: 179, aarch64: 60, why: 'host administration' },
  { name: 'name_to_handle_at', x86_64: 303, aarch64: 264, why: 'file handles bypass the mount view' },
  { name: 'open_by_handle_at', x86_64: 304, aarch64: 265, why: 'file handles bypass the mount view' },
  { name: 'ptrace', x86_64: 101, aarch64: 117, why: 'no agent needs to trace processes; a long history of kernel bugs' },
  { name: 'process_vm_readv', x86_64: 310, aarch64: 270, why: 'another process\'s memory' },
  { name: 'process_vm_writev', x86_64: 311, aarch64: 271, why: 'another process\'s memory' },
  { name: 'setns', x86_64: 308, aarch64: 268, why: 'joining other namespaces' },
  { name: 'io_uring_setup', x86_64: 425, aarch64: 425, why: 'io_uring: a large, bug-prone kernel surface (runtimes fall back to threads)' },
  { name: 'io_uring_enter', x86_64: 426, aarch64: 426, why: 'io_uring' },
  { name: 'io_uring_register', x86_64: 427, aarch64: 427, why: 'io_uring' },
];

/** Decided by their arguments: new user namespaces (the door to every namespaced kernel path) and terminal injection. */
const CONDITIONAL = {
  clone: { x86_64: 56, aarch64: 220 },
  unshare: { x86_64: 272, aarch64: 97 },
  ioctl: { x86_64: 16, aarch64: 29 },
  /** Its flags sit in memory the filter cannot read: ENOSYS makes libc fall back to clone. */
  clone3: { x86_64: 435, aarch64: 435 },
} as const;

// Classic BPF opcodes (linux/filter.h).
const BPF = { LD_W_ABS: 0x20, JEQ_K: 0x15, JGE_K: 0x35, JSET_K: 0x45, RET_K: 0x06 } as const;
/** Offsets in struct seccomp_data: nr, arch, then args[6] as u64 (the low half first on little-endian). */
const DATA = { nr: 0, arch: 4, argLow: (i: number) => 16 + 8 * i } as const;

type Label = string;
type Insn =
  | { op: 'ld'; k: number }
  | { op: 'jeq' | 'jge' | 'jset'; k: number; yes: Label | null; no: Label | null }
  | { op: 'ret'; k: number }
  | { op: 'label'; name: Label };

/** The instructions of the filter, with symbolic jumps (null: the next instruction). */
export function seccompInstructions(): Insn[] {
  const prog: Insn[] = [{ op: 'ld', k: DATA.arch }];
  const arches = Object.keys(AUDIT_ARCH) as SeccompArch[];
  for (const arch of arches) prog.push({ op: 'jeq', k: AUDIT_ARCH[arch], yes: arch, no: null });
  prog.push({ op: 'ret', k: SECCOMP_RET.KILL_PROCESS });
  for (const arch of arches) {
    prog.push({ op: 'label', name: arch }, { op: 'ld', k: DATA.nr });
    if (arch === 'x86_64') prog.push({ op: 'jge', k: X32_SYSCALL_BIT, yes: 'kill', no: null });
    for (const s of DENIED_SYSCALLS) prog.push({ op: 'jeq', k: s[arch], yes: 'eperm', no: null });
    prog.push(
      { op: 'jeq', k: CONDITIONAL.clone3[arch], yes: 'enosys', no: null },
      { op: 'jeq', k: CONDITIONAL.clone[arch], yes: 'flags', no: null },
      { op: 'jeq', k: CONDITIONAL.unshare[arch], yes: 'flags', no: null },
      { op: 'jeq', k: CONDITIONAL.ioctl[arch], yes: 'ioctl', no: 'allow' },
    );
  }
  prog.push(
    // clone and unshare take their flags first on both architectures.
    { op: 'label', name: 'flags' },
    { op: 'ld', k: DATA.argLow(0) },
    { op: 'jset', k: CLONE_NEWUSER, yes: 'eperm', no: 'allow' },
    // The request is an unsigned int: the kernel ignores the upper half.
    { op: 'label', name: 'ioctl' },
    { op: 'ld', k: DATA.argLow(1) },
    { op: 'jeq', k: TIOCSTI, yes: 'eperm', no: null },
    { op: 'jeq', k: TIOCLINUX, yes: 'eperm', no: 'allow' },
    { op: 'label', name: 'allow' },
    { op: 'ret', k: SECCOMP_RET.ALLOW },
    { op: 'label', name: 'eperm' },
    { op: 'ret', k: SECCOMP_RET.ERRNO | EPERM },
    { op: 'label', name: 'enosys' },
    { op: 'ret', k: SECCOMP_RET.ERRNO | ENOSYS },
    { op: 'label', name: 'kill' },
    { op: 'ret', k: SECCOMP_RET.KILL_PROCESS },
  );
  return prog;
}

/** Assembles to struct sock_filter[] ({u16 code, u8 jt, u8 jf, u32 k}, little-endian as on both architectures). */
export function assemble(prog: Insn[]): Buffer {
  const at = new Map<Label, number>();
  let n = 0;
  for (const insn of prog) {
    if (insn.op === 'label') at.set(insn.name, n);
    else n++;
  }
  const out = Buffer.alloc(n * 8);
  let i = 0;
  const offset = (label: Label | null): number => {
    if (label === null) return 0;
    const target = at.get(label);
    if (target === undefined) throw new Error(`seccomp: no label ${label}`);
    const jump = target - (i + 1);
    if (jump < 0 || jump > 255) throw new Error(`seccomp: jump to ${label} out of range (${jump})`);
    return jump;
  };
  for (const insn of prog) {
    if (insn.op === 'label') continue;
    const code = insn.op === 'ld' ? BPF.LD_W_ABS : insn.op === 'ret' ? BPF.RET_K : insn.op === 'jeq' ? BPF.JEQ_K : insn.op === 'jge' ? BPF.JGE_K : BPF.JSET_K;
    const jt = insn.op === 'jeq' || insn.op === 'jge' || insn.op === 'jset' ? offset(insn.yes) : 0;
    const jf = insn.op === 'jeq' || insn.op === 'jge' || insn.op === 'jset' ? offset(insn.no) : 0;
    out.writeUInt16LE(code, i * 8);
    out.writeUInt8(jt, i * 8 + 2);
    out.writeUInt8(jf, i * 8 + 3);
    out.writeUInt32LE(insn.k >>> 0, i * 8 + 4);
    i++;
  }
  return out;
}

let program: Buffer | undefined;
/**
 * The filter for `bwrap --seccomp`, or undefined where this host's architecture has no table
 * (the sandbox then runs without one; ADR 0006 says so).
 */
export function seccompFilter(arch: string = process.arch): Buffer | undefined {
  if (arch !== 'x64' && arch !== 'arm64') return undefined;
  program ??= assemble(seccompInstructions());
  return program;
}
