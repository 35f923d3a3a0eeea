"""Per-file word totals of every .txt file in the workspace; writes word-totals.json.

Runs as a WASI guest: it sees /workspace (and its own directory, read-only) and
nothing else, with no sockets."""
import json, os

totals = {}
for name in sorted(os.listdir(".")):
    if name.endswith(".txt"):
        with open(name, encoding="utf-8", errors="replace") as f:
            words = f.read().lower().split()
        totals[name] = {"words": len(words), "distinct": len(set(words))}
with open("word-totals.json", "w") as f:
    json.dump(totals, f, indent=2, sort_keys=True)
print(json.dumps(totals, sort_keys=True))
