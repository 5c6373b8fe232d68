"""bench/CONFORMANCE.md is written by conformance.py; the scripts run after it each own one
section, which they replace (or append) here."""

import os
from pathlib import Path

CONFORMANCE = Path(__file__).resolve().parent.parent / "CONFORMANCE.md"


def machine():
    """The machine a section was measured on, in one line."""
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), "unknown CPU")
    return f"{cpu}, {os.cpu_count()} cores, kernel {os.uname().release}"


def replace_section(title, lines):
    text = CONFORMANCE.read_text() if CONFORMANCE.exists() else "# Conformance (bench/conformance)\n"
    body = "\n".join(lines) + "\n"
    if title in text:
        start = text.index(title)
        end = text.find("\n## ", start + len(title))
        # A section followed by another keeps one blank line between them.
        following = text[end + 1:] if end != -1 else ""
        text = text[:start] + (body.rstrip("\n") + "\n\n" if following else body) + following
    else:
        text = text.rstrip("\n") + "\n\n" + body
    CONFORMANCE.write_text(text)


def set_summary_row(label, cells):
    """Adds or replaces one row of the summary table at the top (written by conformance.py):
    `| label | cells... |`, after the last row of that table."""
    text = CONFORMANCE.read_text()
    lines = text.split("\n")
    row = "| " + " | ".join([label, *cells]) + " |"
    existing = next((i for i, l in enumerate(lines) if l.startswith(f"| {label} |")), None)
    if existing is not None:
        lines[existing] = row
    else:
        header = next((i for i, l in enumerate(lines) if l.startswith("| check |")), None)
        if header is None:
            return
        end = header
        while end + 1 < len(lines) and lines[end + 1].startswith("|"):
            end += 1
        lines.insert(end + 1, row)
    CONFORMANCE.write_text("\n".join(lines))


def written_by_other_scripts():
    """The summary rows and sections of bench/CONFORMANCE.md that other scripts own (the
    scripts run after conformance.py, and fuzz/run; their titles name the script), so that
    conformance.py can rewrite the rest without losing an hour of Autobahn: (rows, sections
    text)."""
    if not CONFORMANCE.exists():
        return [], ""
    text = CONFORMANCE.read_text()
    rows = [l for l in text.split("\n") if l.startswith("| ") and "(section below)" in l.split(" | ")[0]]
    sections = []
    for part in text.split("\n## ")[1:]:
        title = part.split("\n", 1)[0]
        if "(bench/conformance/" in title or "(fuzz/run)" in title:
            sections.append("## " + part.rstrip("\n"))
    return rows, "\n\n".join(sections)
