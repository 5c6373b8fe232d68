"""bench/CONFORMANCE.md is written by conformance.py; the scripts run after it each own one
section, which they replace (or append) here."""

from pathlib import Path

CONFORMANCE = Path(__file__).resolve().parent.parent / "CONFORMANCE.md"


def replace_section(title, lines):
    text = CONFORMANCE.read_text() if CONFORMANCE.exists() else "# Conformance (bench/conformance)\n"
    body = "\n".join(lines) + "\n"
    if title in text:
        start = text.index(title)
        end = text.find("\n## ", start + len(title))
        text = text[:start] + body + (text[end + 1:] if end != -1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + body
    CONFORMANCE.write_text(text)
