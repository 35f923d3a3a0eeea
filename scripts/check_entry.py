#!/usr/bin/env python3
"""Checks that the static-pie binary's entry point needs nothing glibc's start sets up.

    scripts/check_entry.py BINARY

`skillbox_entry` (crates/skillbox-entry) runs before glibc relocates the binary,
resolves its IFUNCs and sets up thread-local storage. Every instruction reachable
from it, up to glibc's `_start` (by direct calls and jumps, and through any code
address it takes with `lea`, such as a signal handler's), must therefore:
- address (rip-relative) only sections nothing writes at start: no GOT, no
  `.data.rel.ro` (a relocated pointer read there is still a link-time offset);
- not touch `%fs` or `%gs` (thread-local storage, the stack protector's canary);
- call nothing through memory or a register (the target could not be checked, and a
  call through the GOT is an unrelocated address), nor jump through memory, nor jump
  through a register but to a jump table's targets in the same function, and call
  nothing in `.iplt` (memcpy and the other IFUNCs, not yet resolved).
One call through the GOT is let through: `panic_cannot_unwind`, which Rust puts on the
unwind path of an `extern "C"` function. Only an unwinding panic reaches it, and every
other panic's call would be caught by the rules above.
A slip there shows only in this binary (a dynamic build is relocated by ld.so before
its entry point runs), so this reads the machine code instead of waiting for a crash.
Prints the functions it walked; exits 1 naming each instruction that breaks a rule.
"""

import re
import subprocess
import sys

ENTRY = "skillbox_entry"
HANDOFF = "_start"
ONLY_ON_UNWIND = "core::panicking::panic_cannot_unwind"


def sections(binary):
    """(start, end, name, writable) of each allocated section."""
    out = subprocess.run(["readelf", "-SW", binary], check=True, capture_output=True,
                         text=True).stdout
    found = []
    for line in out.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)"
                     r"\s+[0-9a-f]+\s+([A-Za-z]*)", line)
        if m and "A" in m.group(4):
            start, size = int(m.group(2), 16), int(m.group(3), 16)
            found.append((start, start + size, m.group(1), "W" in m.group(4)))
    return found


def functions(binary):
    """Address -> (size, name) of each function symbol."""
    out = subprocess.run(["nm", "-S", "-C", "--defined-only", binary], check=True,
                         capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) == 4 and parts[2] in "tTwW":
            found[int(parts[0], 16)] = (int(parts[1], 16), parts[3])
    return found


def relocated(binary):
    """Address of a slot -> the address the relocation puts there."""
    out = subprocess.run(["readelf", "-rW", binary], check=True, capture_output=True,
                         text=True).stdout
    slots = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in ("R_X86_64_RELATIVE", "R_X86_64_IRELATIVE"):
            slots[int(parts[0], 16)] = int(parts[3], 16)
    return slots


def main():
    binary = sys.argv[1]
    allocated = sections(binary)
    symbols = functions(binary)
    slots = relocated(binary)
    by_name = {name: address for address, (_, name) in symbols.items()}
    if ENTRY not in by_name:
        sys.exit(f"check_entry: {binary} has no {ENTRY} symbol")

    def section_of(address):
        for start, end, name, writable in allocated:
            if start <= address < end:
                return name, writable
        return None, False

    problems, walked, queue = [], [], [by_name[ENTRY]]
    seen = set(queue)
    while queue:
        address = queue.pop()
        size, name = symbols[address]
        walked.append(name)
        listing = subprocess.run(
            ["objdump", "-d", "--no-show-raw-insn", "-C", f"--start-address={address:#x}",
             f"--stop-address={address + size:#x}", binary],
            check=True, capture_output=True, text=True).stdout
        # Whether the function takes a `.rodata` address that could be a jump table.
        jump_table_base = any(
            section_of(int(t, 16))[0] == ".rodata"
            for t in re.findall(r"lea\s+-?0x[0-9a-f]+\(%rip\),%\w+\s+#\s+([0-9a-f]+)",
                                listing))
        for line in listing.splitlines():
            m = re.match(r"\s*([0-9a-f]+):\s+(.*)", line)
            if not m:
                continue
            at, text = m.group(1), m.group(2).strip()
            where = f"{name} +{int(at, 16) - address:#x}: {text}"
            words = text.split()
            mnemonic = words[0] if words else ""
            if mnemonic in ("notrack", "bnd") and len(words) > 1:
                mnemonic = words[1]
            if "%fs" in text or "%gs" in text:
                problems.append(f"thread-local storage: {where}")
            target = re.search(r"#\s+([0-9a-f]+)", text)
            if "*" in text and "(%rip)" in text and target:
                slot = int(target.group(1), 16)
                name_there = symbols.get(slots.get(slot, -1), (0, "?"))[1]
                if mnemonic.startswith("call") and name_there == ONLY_ON_UNWIND:
                    continue
                problems.append(f"calls {name_there} through the GOT: {where}")
                continue
            if "(%rip)" in text and target:
                taken = int(target.group(1), 16)
                section, writable = section_of(taken)
                if writable or section is None:
                    problems.append(f"addresses {section or 'no section'}: {where}")
                # A code address taken (a handler, a function pointer) is walked too.
                if taken in symbols and taken not in seen and symbols[taken][1] != HANDOFF:
                    seen.add(taken)
                    queue.append(taken)
                elif mnemonic == "lea" and section == ".text" and taken not in symbols:
                    if not (address <= taken < address + size):
                        problems.append(f"takes an address inside another function: {where}")
            if mnemonic.startswith(("call", "jmp")) or mnemonic.startswith("j"):
                if "*" in text:
                    # A jump table's `jmp *%reg` stays in the function (its targets
                    # are offsets in `.rodata` from a base the function takes with
                    # `lea`); a tail call through a register does not.
                    if mnemonic.startswith("call") or "(" in text:
                        problems.append(f"an indirect {mnemonic}: {where}")
                    elif not jump_table_base:
                        problems.append(f"a jump through a register, and no jump table "
                                        f"in the function: {where}")
                    continue
                direct = re.search(r"\s([0-9a-f]+)\s+<([^>]*)>", text)
                if not direct:
                    continue
                goes_to = int(direct.group(1), 16)
                if address <= goes_to < address + size:
                    continue
                section, _ = section_of(goes_to)
                if section == ".iplt" or "@plt" in direct.group(2):
                    problems.append(f"calls an IFUNC through the PLT: {where}")
                elif goes_to in symbols and symbols[goes_to][1] == HANDOFF:
                    continue
                elif goes_to in symbols:
                    if goes_to not in seen:
                        seen.add(goes_to)
                        queue.append(goes_to)
                else:
                    problems.append(f"jumps into the middle of something: {where}")
    for name in walked:
        print(f"check_entry: walked {name}")
    if problems:
        for problem in problems:
            print(f"check_entry: {problem}", file=sys.stderr)
        sys.exit(1)
    print(f"check_entry: {len(walked)} functions reachable from {ENTRY} need nothing "
          f"glibc's start sets up")


if __name__ == "__main__":
    main()
