"""Merge the tables a lent GPU run brought back into this checkout's results/, appending only new rows.

    python .ci/merge_results.py UNPACKED_DIR --commit SHA [--dry-run]

UNPACKED_DIR is where $OUT/results.tgz was unpacked (it holds results/<device>/...). For every CSV table of every
device folder there (results.csv, checks.csv, profiles.csv, ncu.csv, build_times.csv, ...), the rows this checkout's
table lacks (compared on every column but the commit) are appended under its header, stamped with --commit: the
sha of the tree that was sent, written out on this machine, shortened to 7 characters like the other rows. The lent
copy's own .git is stale (it stamped rows with an older commit, "+dirty" or not), and rows already here keep their
own commits. Figures are not copied: redraw them from the merged rows (python -m lab plot --device NAME).
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab import results  # noqa: E402  (the checkout's own lab: its header rule)


def merge_table(src: Path, dst: Path, sent: str, dry: bool) -> tuple[int, int]:
    with src.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        src_cols = reader.fieldnames or []
    cols = src_cols
    have: set[tuple] = set()
    if dst.exists():
        with dst.open(newline="") as f:
            header = next(csv.reader(f), [])
        if len(header) < len(src_cols) and not dry:   # a table from before columns were added: extend it first
            results.upgrade_header(dst, src_cols)
        with dst.open(newline="") as f:
            reader = csv.DictReader(f)
            cols = reader.fieldnames or []
            old_rows = list(reader)
        if dry and len(cols) < len(src_cols) and cols == src_cols[:len(cols)]:
            cols = src_cols   # (what the header would be after the upgrade a real merge makes)
        have = {tuple(r.get(c) or "" for c in cols if c != "commit") for r in old_rows}
        extra = [c for c in src_cols if c not in cols]
        if extra:
            sys.exit(f"{src}: columns {extra} are not in {dst}: update the table's header first (lab.results)")
    new = [r for r in rows if tuple(r.get(c) or "" for c in cols if c != "commit") not in have]
    for r in new:
        if "commit" in cols:
            r["commit"] = sent[:7]
    if new and not dry:
        fresh = not dst.exists()
        dst.parent.mkdir(parents=True, exist_ok=True)
        with dst.open("a", newline="") as f:
            w = csv.DictWriter(f, cols, extrasaction="ignore")
            if fresh:
                w.writeheader()
            w.writerows(new)
    return len(new), len(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("unpacked", type=Path)
    ap.add_argument("--commit", required=True, help="the sha of the tree sent to the GPU (written out here)")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    src_root = args.unpacked / "results"
    if not src_root.is_dir():
        sys.exit(f"{src_root} does not exist: unpack $OUT/results.tgz into {args.unpacked} first")
    for dev in sorted(p for p in src_root.iterdir() if p.is_dir()):
        for table in sorted(dev.glob("*.csv")):
            new, total = merge_table(table, ROOT / "results" / dev.name / table.name, args.commit, args.dry_run)
            print(f"{dev.name}/{table.name}: {new} new of {total}{' (dry run)' if args.dry_run else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
