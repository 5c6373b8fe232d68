#!/usr/bin/python3
"""Runs a command inside the sandbox a systemd unit file describes, where no systemd runs
as PID 1 (CI machines, containers): the unit's SystemCallFilter= (groups expanded by
`systemd-analyze syscall-filter`, the same tables systemd uses), SystemCallArchitectures=,
RestrictAddressFamilies=, CapabilityBoundingSet=, UMask= and NoNewPrivileges=, applied with
libseccomp as systemd applies them. Stricter than systemd on one point: a call outside the
filter kills the process (systemd's SystemCallErrorNumber=EPERM would only fail it), so a
test run through here fails loudly on any call the unit would refuse.

ProtectProc=invisible is the caller's part (a private /proc mounted with hidepid=invisible,
tests/unit_sandbox.rs). Usage: unit_sandbox.py UNIT_FILE COMMAND [ARG...]
"""

import ctypes
import os
import socket
import subprocess
import sys

import seccomp

CAPABILITIES = {"CAP_NET_BIND_SERVICE": 10}
PR_CAPBSET_DROP = 24
LAST_CAPABILITY = 40


def unit_settings(path):
    """The [Service] settings, each name with its values in order."""
    settings = {}
    with open(path, encoding="utf-8") as unit:
        for line in unit:
            line = line.strip()
            if not line or line.startswith(("#", ";", "[")) or "=" not in line:
                continue
            name, value = line.split("=", 1)
            settings.setdefault(name, []).append(value)
    return settings


def expand(name, seen=None):
    """The system calls a name stands for: itself, or a group's members, recursively."""
    seen = set() if seen is None else seen
    if not name.startswith("@"):
        return {name}
    if name in seen:
        return set()
    seen.add(name)
    listing = subprocess.run(
        ["systemd-analyze", "syscall-filter", name],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    calls = set()
    for line in listing[1:]:
        line = line.strip()
        if line and not line.startswith("#"):
            calls |= expand(line, seen)
    return calls


def allowed_calls(settings):
    """systemd's reading of SystemCallFilter=: the first list allows (the rest denied), each
    list starting with ~ takes calls away."""
    allowed = set()
    for value in settings.get("SystemCallFilter", []):
        deny = value.startswith("~")
        names = set()
        for name in value.lstrip("~").split():
            names |= expand(name)
        allowed = allowed - names if deny else allowed | names
    return allowed


def families(settings):
    names = " ".join(settings.get("RestrictAddressFamilies", [])).split()
    return [getattr(socket, name) for name in names]


def drop_capabilities(settings):
    keep = {
        CAPABILITIES[name]
        for value in settings.get("CapabilityBoundingSet", [])
        for name in value.split()
    }
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in range(LAST_CAPABILITY + 1):
        if capability not in keep:
            libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)


def main():
    unit, command = sys.argv[1], sys.argv[2:]
    settings = unit_settings(unit)
    allowed = allowed_calls(settings)
    if not allowed:
        sys.exit(f"{unit} has no SystemCallFilter=")
    if settings.get("SystemCallArchitectures") != ["native"]:
        sys.exit(f"{unit} does not set SystemCallArchitectures=native")
    if "UMask" in settings:
        os.umask(int(settings["UMask"][-1], 8))
    drop_capabilities(settings)

    # Other architectures' calls are refused too (libseccomp's default: native only).
    rules = seccomp.SyscallFilter(defaction=seccomp.KILL_PROCESS)
    address_families = families(settings)
    for call in sorted(allowed):
        if call == "socket" and address_families:
            for family in address_families:
                rules.add_rule(seccomp.ALLOW, call, seccomp.Arg(0, seccomp.EQ, family))
            continue
        try:
            rules.add_rule(seccomp.ALLOW, call)
        except (RuntimeError, ValueError):
            pass  # a call this architecture does not have
    # NoNewPrivileges=yes: libseccomp sets it before loading the filter.
    rules.load()
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
