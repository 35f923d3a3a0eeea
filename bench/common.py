"""Helpers shared by the Python parts of the benchmarks in bench/."""

import threading
import time


def rate(worker, concurrency, seconds):
    """Completions per second of `worker()` from `concurrency` threads for `seconds`."""
    counts = [0] * concurrency
    end = time.monotonic() + seconds

    def loop(i):
        state = {}
        while time.monotonic() < end:
            worker(state)
            counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(concurrency)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - start)
