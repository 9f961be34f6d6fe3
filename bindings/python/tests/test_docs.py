"""docs/bindings.md stays true: every code block announced with
`<!-- example: PATH -->` equals that file (for a Markdown file: its first code
block of the same language), and the Python example runs."""

import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DOC = os.path.join(ROOT, "docs", "bindings.md")
FENCE = re.compile(r"```(\w+)\n(.*?)```", re.S)


def doc_examples():
    text = open(DOC).read()
    pattern = re.compile(r"<!-- example: (\S+) -->\n```(\w+)\n(.*?)```", re.S)
    return [(m.group(1), m.group(2), m.group(3)) for m in pattern.finditer(text)]


def source_of(path, lang):
    text = open(os.path.join(ROOT, path)).read()
    if path.endswith(".md"):
        for m in FENCE.finditer(text):
            if m.group(1) == lang:
                return m.group(2)
        raise AssertionError("%s has no %s block" % (path, lang))
    return text


def test_examples_match_their_files():
    examples = doc_examples()
    assert {lang for _, lang, _ in examples} >= {"python", "java", "go", "rust"}
    for path, lang, block in examples:
        assert block.strip() == source_of(path, lang).strip(), "docs/bindings.md differs from " + path


def test_python_example_runs():
    script = os.path.join(ROOT, "bindings", "python", "examples", "quickstart.py")
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, cwd=os.path.dirname(script),
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    assert out.returncode == 0, out.stderr
    assert "dropped [24, 24] kept positions (0, 1, 2, 3, 28," in out.stdout
    assert "KVC_ERR_SEQ_NOT_FOUND - sequence 99 does not exist" in out.stdout


def test_tiers_example_runs():
    script = os.path.join(ROOT, "bindings", "python", "examples", "tiers.py")
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, cwd=os.path.dirname(script),
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "queued 3",
        "pool 0 tiers 48",
        "loaded 48 attached 48",
        "host tier: demotions 3 hits 3 last error ''",
    ]
