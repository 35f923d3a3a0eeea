"""Summarizes every .csv file in the workspace into summary.json."""
import csv, json, pathlib

summary = {}
for path in sorted(pathlib.Path(".").glob("*.csv")):
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    means = {}
    for column in (rows[0].keys() if rows else []):
        try:
            values = [float(r[column]) for r in rows]
        except ValueError:
            continue
        means[column] = sum(values) / len(values)
    summary[path.name] = {"rows": len(rows), "columns": len(rows[0]) if rows else 0, "means": means}
pathlib.Path("summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary))
