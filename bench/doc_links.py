#!/usr/bin/env python
"""Every relative link in README.md and docs/*.md points to an existing file (and, for #anchors, an existing heading)."""
import re, sys
from pathlib import Path
def slug(h):
    h = h.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")
bad = 0
files = [Path("README.md"), *Path("docs").glob("*.md")]
for f in files:
    for target in re.findall(r"\]\(([^)\s]+)\)", f.read_text()):
        if target.startswith(("http", "mailto")):
            continue
        path, _, anchor = target.partition("#")
        dest = (f.parent / path).resolve() if path else f.resolve()
        if not dest.exists():
            print(f"{f}: missing {target}"); bad += 1; continue
        if anchor and dest.suffix == ".md":
            heads = {slug(h) for h in re.findall(r"^#+ (.*)$", dest.read_text(), re.M)}
            if anchor not in heads:
                print(f"{f}: no heading #{anchor} in {path or f}"); bad += 1
print(f"{bad} broken of the links in {len(files)} files"); sys.exit(bad > 0)
