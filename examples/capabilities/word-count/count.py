"""Counts the words of every .txt file in the workspace; writes word-count.json."""
import collections, json, pathlib, re, sys

top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 10
counts = collections.Counter()
for path in sorted(pathlib.Path(".").rglob("*.txt")):
    counts.update(re.findall(r"[a-z']+", path.read_text(errors="replace").lower()))
result = [{"word": w, "count": n} for w, n in counts.most_common(top)]
pathlib.Path("word-count.json").write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps(result))
