"""`python -m bsa_cli` and the `bsa` command: load the command line, then run it.

Loading it loads NumPy, BLAS and friends; where that fails (an address-space limit, `ulimit -v`, too small
for them, or a library missing) bsa says so in one `Error:` line with exit code 2, never a traceback.
"""

from __future__ import annotations

import sys

from .core.exit_codes import ExitCode  # enum alone: loads before NumPy

#: Least address space (`ulimit -v`) bsa starts with: NumPy and OpenBLAS need about 250 MiB to load on a
#: small machine, and OpenBLAS ends the process (exit code 1) where it cannot get its buffers.
MIN_ADDRESS_SPACE = 384 << 20


def _address_space_limit() -> int | None:
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def _refuse(message: str) -> None:
    sys.stderr.write(f"Error: {message}\n")
    sys.exit(ExitCode.USAGE)


def run() -> None:
    """Run the `bsa` command line."""
    limit = _address_space_limit()
    if limit is not None and limit < MIN_ADDRESS_SPACE:
        _refuse(
            f"the address-space limit (ulimit -v) is {limit >> 20} MiB; bsa needs at least "
            f"{MIN_ADDRESS_SPACE >> 20} MiB to load NumPy and BLAS: raise it (ulimit -v)"
        )
    try:
        from .cli import main

        main()  # a command loads NumPy and BLAS as it starts (`bsa --help` loads neither)
    except MemoryError:
        _refuse(
            "out of memory while loading bsa's libraries (NumPy, BLAS): raise the memory or "
            "address-space limit (ulimit -v)"
        )
    except ImportError as exc:  # an OSError of a command is its own one-line error (cli._Commands)
        reason = " ".join(str(exc).split())[:300]
        _refuse(
            f"cannot load bsa's libraries: {type(exc).__name__}: {reason} (too little memory for them? "
            "check ulimit -v; a package missing? reinstall bsa)"
        )


if __name__ == "__main__":
    run()
