#!/usr/bin/env python3
"""arch_layers_detects_violation: check_layers.py on the fixture tree (tests/arch/fixture) must
exit 1 and report exactly the violations of fixture/expected.txt (among them a codec file
including "core/pool.h", and an api file using a name of codec that a core header brought in),
nothing else: no forbidden include goes unseen, and comments and
allowed includes are not reported.

    python3 tests/arch/expect_violations.py
"""
import os
import re
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
fixture = os.path.join(here, 'fixture')
with open(os.path.join(fixture, 'expected.txt'), encoding='utf-8') as f:
    expected = [l.rstrip('\n') for l in f if l.strip() and not l.startswith('#')]
run = subprocess.run([sys.executable, os.path.join(here, 'check_layers.py'), '--root', fixture],
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
print(run.stdout, end='')
reported = [l for l in run.stdout.splitlines() if re.match(r'^[^\s:]+\.\w+(:\d+)?: ', l)]
problems = []
if run.returncode != 1:
    problems.append('check_layers.py exited %d, not 1' % run.returncode)
for e in expected:
    if not any(l.startswith(e) for l in reported):
        problems.append('not reported: %s' % e)
for l in reported:
    if not any(l.startswith(e) for e in expected):
        problems.append('reported, not expected: %s' % l)
for p in problems:
    print('arch_layers_detects_violation: ' + p)
if not problems:
    print('arch_layers_detects_violation: OK (%d violations found, as expected)' % len(expected))
sys.exit(1 if problems else 0)
