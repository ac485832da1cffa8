"""`ada-inspect PATH [--json]`: describe a local Hugging Face checkpoint from its config.json
and safetensors headers (instant on a 7B checkpoint): family, size, dtype, whether ada
loads it (ada/models/summary.py)."""

from __future__ import annotations

import argparse
import json
import sys

from ada.models.hf_config import CheckpointError
from ada.models.summary import format_info, inspect_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ada-inspect", description="Describe a local Hugging Face checkpoint (headers only)."
    )
    parser.add_argument("path", help="checkpoint directory (config.json + *.safetensors)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    from ada import quiet

    quiet.quiet_start()
    try:
        info = inspect_checkpoint(args.path)
    except CheckpointError as e:
        print(f"ada-inspect: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
