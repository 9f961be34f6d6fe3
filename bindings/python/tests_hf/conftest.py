"""pytest setup of the transformers (hf_*) and kvpress (kvpress_*) tests.

They run in the venvs scripts/setup-python.sh creates (the ctest wrapper,
run_tests.sh, reports a missing venv as skipped); a test skipped inside
pytest counts as a failure."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def sdpa():
    """(model, tokenizer): SmolLM2 with sdpa attention, loaded once per test process."""
    import hfmodel

    return hfmodel.load("sdpa")


@pytest.fixture(scope="session")
def paged():
    """(model, tokenizer): SmolLM2 with attn_implementation="kvcache"."""
    import hfmodel
    import kvcache.hf as kh

    return hfmodel.load(kh.ATTN_IMPLEMENTATION)


def pytest_sessionfinish(session, exitstatus):
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None and tr.stats.get("skipped"):
        tr.write_line("%d test(s) skipped: a skip counts as a failure here" % len(tr.stats["skipped"]))
        session.exitstatus = 1
