"""Shared by the benchmark scripts: JSON output."""

import json
import os


def write_json(results, path):
    """Writes `results` to `path` (creating its folder) and says where."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {path}")
