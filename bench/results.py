"""results.py - writes bench/results/NAME.md and NAME.json from the JSON of `lmk bench --json` runs.

The README and docs quote figures from these files only; a figure is refreshed by running the benchmark
again and this script over its output, never by editing numbers by hand.

    build/lmk bench --all --backend cuda --json > /tmp/bench.json
    python3 bench/results.py --name h200 --device "NVIDIA H200" --command "lmk bench --all --backend cuda" \
        /tmp/bench.json [more.json ...]

Several inputs (e.g. one per op) are merged in order; a case that appears twice keeps its last row.
The Markdown file holds one table per op: case, time, GB/s, the copy ceiling and the fraction of it.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load_rows(paths):
    """The rows of every input, later duplicates of a (backend, case) replacing earlier ones."""
    rows = {}
    for path in paths:
        with open(path) as f:
            for row in json.load(f):
                rows[(row["backend"], row["case"])] = row
    return list(rows.values())


def commit_of_tree():
    """The checkout's commit (with -dirty when it has changes), or 'unknown' outside git."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=HERE,
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def time_text(us):
    return "%.2f us" % us if us < 10 else "%.1f us" % us


def markdown(rows, args):
    lines = ["# `lmk bench` on %s" % args.device, "",
             "Written by bench/results.py from `%s` (commit %s); do not edit by hand." % (args.command, args.commit),
             "docs/bench.md explains the columns: the time is the median per call, the ceiling a copy of as",
             "many bytes measured in the same run, the fraction the op's bytes per second over it.", ""]
    ops = []
    for row in rows:
        if row["op"] not in ops:
            ops.append(row["op"])
    for op in ops:
        lines += ["## %s" % op, "", "| case | time | GB/s | ceiling GB/s | fraction |", "| --- | --- | --- | --- | --- |"]
        for row in rows:
            if row["op"] == op:
                lines.append("| %s | %s | %.0f | %.0f | %.2f |" % (row["case"].replace("|", "\\|"), time_text(row["time_us"]),
                                                                 row["gb_s"], row["ceiling_gb_s"], row["fraction"]))
        lines.append("")
    return "\n".join(lines)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", required=True, help="file stem under bench/results/, e.g. h200 or cpu-2core")
    ap.add_argument("--device", required=True, help="the machine, in words")
    ap.add_argument("--command", required=True, help="the lmk bench command that produced the inputs")
    ap.add_argument("--commit", default=None, help="default: git describe of this checkout")
    ap.add_argument("inputs", nargs="+", help="files of `lmk bench --json` output")
    args = ap.parse_args(argv)
    args.commit = args.commit or commit_of_tree()
    rows = load_rows(args.inputs)
    if not rows:
        sys.exit("results.py: no rows in %s" % ", ".join(args.inputs))
    out_dir = os.path.join(HERE, "results")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, args.name + ".json"), "w") as f:
        json.dump({"device": args.device, "command": args.command, "commit": args.commit, "rows": rows}, f, indent=1)
        f.write("\n")
    with open(os.path.join(out_dir, args.name + ".md"), "w") as f:
        f.write(markdown(rows, args))
    print("results.py: %d rows -> bench/results/%s.md, .json" % (len(rows), args.name))


if __name__ == "__main__":
    main(sys.argv[1:])
