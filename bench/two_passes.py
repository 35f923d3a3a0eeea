"""The markdown table of two hyperfine passes (the second reversed): each command's
median in each pass, in milliseconds, under a title with the date and the cores.

    two_passes.py A.json B.json TITLE INTRO DECIMALS NAME=LABEL...

Rows come in the order of the labels; a NAME with no result in the run is left out."""

import json
import os
import statistics
import sys
import time


def main(a, b, title, intro, decimals, *labels):
    med = {}
    for path in (a, b):
        for r in json.load(open(path))["results"]:
            med.setdefault(r["command"], []).append(statistics.median(r["times"]) * 1000)
    print(f"# {title} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {len(os.sched_getaffinity(0))} cores)\n")
    print(f"{intro}\n")
    print("| what | pass 1 | pass 2 |")
    print("|---|---:|---:|")
    for entry in labels:
        name, label = entry.split("=", 1)
        if name in med:
            ms = med[name]
            print(f"| {label} | {ms[0]:.{decimals}f} ms | {ms[1]:.{decimals}f} ms |")


if __name__ == "__main__":
    main(*sys.argv[1:])
