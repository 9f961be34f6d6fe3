"""README.md's transformers example, run as written (the block after the readme-example marker)."""

import os
import re
import subprocess
import sys

import hfmodel


def test_readme_example_runs():
    with open(os.path.join(hfmodel.ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"<!-- readme-example: bindings/python/tests_hf/test_hf_readme.py runs this block -->\n```python\n(.*?)```",
                  text, re.S)
    assert m, "README.md lost its transformers example"
    code = m.group(1)
    hfmodel.gguf_path()  # fetched if missing
    env = dict(os.environ)
    if os.path.realpath(os.path.join(os.path.expanduser("~"), ".cache", "kvcache")) != os.path.realpath(
            hfmodel.model_cache()):  # the example's folder is the default model cache
        code = code.replace('os.path.expanduser("~/.cache/kvcache")', repr(hfmodel.model_cache()))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=500)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("Once upon a time, a little fox") and len(lines[0]) > 60
    stats = eval(lines[-1])  # a dict literal
    assert stats["strategy"] == "int8:per-token" and stats["tokens_stored"] > 0
    assert 8.0 < stats["bits_per_element"] < 16.0
