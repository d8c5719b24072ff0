"""Write docs/config_reference.md from the `rl` commands' config classes (run after changing a config).

    python scripts/gen_config_reference.py            # rewrite the file
    python scripts/gen_config_reference.py --check    # exit 1 when the file is out of date
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rl_apps.reference import render_reference

TARGET = Path(__file__).resolve().parents[1] / "docs" / "config_reference.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    text = render_reference()
    if parser.parse_args().check:
        current = TARGET.read_text() if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET} is out of date: run python scripts/gen_config_reference.py", file=sys.stderr)
            return 1
        return 0
    tmp = TARGET.with_name(f".{TARGET.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, TARGET)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
