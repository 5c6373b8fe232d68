"""Copies the last fuzz/run (fuzz/RESULTS.md) into bench/CONFORMANCE.md: its own section and a
row of the summary table. Run by fuzz/run once every target has run."""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import replace_section, set_summary_row  # noqa: E402

SECTION = "## Fuzzing (fuzz/run)"
RESULTS = Path(__file__).resolve().parent.parent.parent / "fuzz" / "RESULTS.md"


def main():
    text = RESULTS.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| target")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    seconds = sum(int(c[1]) for c in cells)
    executions = sum(int(c[2]) for c in cells if c[2].isdigit())
    crashes = sum(int(c[4]) for c in cells)
    run_line = next((line for line in text.splitlines() if line.startswith("Run on ")), "")
    if crashes == 0:
        verdict = (f"{len(cells)} targets, {seconds / 60:.0f} min of fuzzing, {executions:,} executions, "
                   "0 crashes. A crash stops `fuzz/run`; its input becomes a seed in "
                   "`fuzz/corpus/TARGET` beside the fix (none so far).")
    else:
        verdict = (f"{len(cells)} targets, {seconds / 60:.0f} min, {executions:,} executions, "
                   f"**{crashes} crashes**: see fuzz/artifacts.")
    lines = [SECTION, "", re.sub(r"^Run on", "Last run on", run_line), "",
             *[line for line in text.splitlines() if line.startswith("|")], "", verdict, ""]
    replace_section(SECTION, lines)
    set_summary_row("cargo fuzz, all targets (section below)",
                    [f"{seconds / 60:.0f} min, {len(cells)} targets, {crashes} crashes", "not run"])


if __name__ == "__main__":
    main()
