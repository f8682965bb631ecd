"""Edit a rendered command line: replace a flag's value, drop flags (either spelling,
``--flag value`` or ``--flag=value``). Shared by the rendered-plane tests and the demo script."""

from __future__ import annotations


def set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """``flag value`` or ``flag=value`` replaced; the flag must be there (ValueError if not)."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == flag:
            out[i + 1] = value
            return out
        if arg.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return out
    raise ValueError(f"{flag} is not in the rendered command {argv}")


def without_flags(argv: list[str], *flags: str) -> list[str]:
    """``argv`` without these flags and their values (either spelling)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not any(arg.startswith(f + "=") for f in flags):
            out.append(arg)
    return out
