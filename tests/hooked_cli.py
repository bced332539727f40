"""Test-only entry point: the ``shardfeed`` CLI with fault hooks (``FaultHooks``) for every pack it runs.

Usage (what the kill/Ctrl-C tests run in a subprocess)::

    python tests/hooked_cli.py '{"sample_delay_s": 0.06}' -q pack SRC OUT ...

The first argument is the JSON of :class:`shardfeed.convert.write.faults.FaultHooks`; the rest are the
CLI's own arguments. Production code reads no environment variable for this: the hooks go to the
Click group as its context object (``main(args, obj={"faults": hooks})``), and ``shardfeed pack``
passes them on as ``PackOptions(faults=...)``.
"""

from __future__ import annotations

import json
import sys

from shardfeed.convert.cli import main
from shardfeed.convert.write.faults import FaultHooks

__all__ = ["hooked_command"]


def hooked_command(hooks: dict) -> list[str]:
    """The argv prefix that runs the CLI with ``hooks`` (a dict of FaultHooks fields)."""
    return [sys.executable, "-P", __file__, json.dumps(hooks)]


if __name__ == "__main__":
    main(sys.argv[2:], prog_name="shardfeed", obj={"faults": FaultHooks(**json.loads(sys.argv[1]))})
