"""`python -m tests.fuzz --records 100000 [--seed N]`: fuzz on demand, print the counts;
exit 1 if any batch raised or broke the property."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from tests.fuzz import run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=50)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # `record-failed` logs a traceback per record
    started = time.monotonic()
    counts = run(args.records, seed=args.seed, batch_size=args.batch_size)
    seconds = time.monotonic() - started
    print(f"records {counts.records} in {counts.batches} batches, {seconds:.1f} s")
    print(f"decided {counts.decided}, dead-lettered {counts.dead_lettered}")
    print("kinds:", dict(counts.kinds.most_common()))
    print("dead-letter reasons:", dict(counts.reasons.most_common()))
    print(f"crashes {len(counts.crashes)}")
    for crash in counts.crashes[:20]:
        print("  ", crash)
    return 1 if counts.crashes else 0


if __name__ == "__main__":
    sys.exit(main())
