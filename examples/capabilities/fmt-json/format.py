"""Formats the JSON document on stdin: sorted keys, two-space indents."""
import json, sys

try:
    document = json.load(sys.stdin)
except json.JSONDecodeError as e:
    print(f"fmt-json: stdin is not JSON: line {e.lineno} column {e.colno}: {e.msg}", file=sys.stderr)
    sys.exit(1)
json.dump(document, sys.stdout, indent=2, sort_keys=True)
sys.stdout.write("\n")
