"""`tierd` command line: `tierd serve ...` and `tierd bench ...`, each owned by its module."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("tierd.serve:main", "run the tier daemon"),
    "bench": ("tierd.bench:main", "copy, file-read and checksum speed"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help"} or args[0] not in COMMANDS:
        lines = ["usage: tierd <command> [options]", "", "commands:"]
        lines += [f"  {name:<8} {help_text}" for name, (_, help_text) in COMMANDS.items()]
        print(
            "\n".join(lines),
            file=sys.stdout if args[:1] in ([], ["-h"], ["--help"]) else sys.stderr,
        )
        return 0 if args[:1] in ([], ["-h"], ["--help"]) else 2
    module_name, func_name = COMMANDS[args[0]][0].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    result: int = func(args[1:])
    return result


if __name__ == "__main__":
    raise SystemExit(main())
