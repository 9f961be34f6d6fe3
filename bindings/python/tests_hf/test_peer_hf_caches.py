"""bench/peers/hf_caches.py on one short window with two peers and our own rows: its JSON holds the
values the script promises (bits counted from the bytes the caches hold, KL and top-1 against the
DynamicCache reference), `kvcache eval --peer` reads and prints it beside our rows, and refuses a
report of another model, another window length or other token ids with a message naming which.

Runs in the hf venv (quanto and HQQ; PEERS) or the kvpress venv (kvpress presses; PEERS_KVPRESS),
chosen by what the venv has."""

import json
import math
import os
import subprocess
import sys

import pytest

import hfmodel

SCRIPT = os.path.join(hfmodel.ROOT, "bench", "peers", "hf_caches.py")
CTX = 192  # one window; its prefill of 96 positions exceeds kvpress SnapKV's window of 64


def have(mod):
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


KVPRESS = have("kvpress")
ROWS = (["kvpress-SnapKV@0.5", "kvpress-Knorm@0.7", "kvpress-AdaKV-SnapKV@0.7", "ours:snapkv:budget=0.5+f32"]
        if KVPRESS else
        ["quanto-int4", "hqq-int4-r32", "ours:f32", "ours:int8:per-token"])


def cli():
    path = os.environ.get("KVCACHE_CLI") or os.path.join(hfmodel.ROOT, "build", "tools", "kvcache")
    assert os.path.exists(path), "the kvcache tool (KVCACHE_CLI) is needed: %s" % path
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("peer") / "peer.json")
    r = subprocess.run([sys.executable, SCRIPT, "--rows", ",".join(ROWS), "--ctx", str(CTX), "--max-tokens",
                        str(CTX - 1), "--threads", "1", "--json", out], capture_output=True, text=True, timeout=500)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(out) as f:
        return out, json.load(f), r.stdout


def rows_by_name(rep):
    return {(r["strategy"], r["protocol"]): r for r in rep["results"]}


def test_report_values(report):
    _, rep, stdout = report
    assert rep["model"] == hfmodel.GGUF and rep["ctx"] == CTX and rep["windows"] == 1
    assert rep["tokens_scored"] == CTX - 1 and rep["token_ids_count"] == CTX
    assert len(rep["token_ids_sha256"]) == 64
    rows = rows_by_name(rep)
    protocols = {"prefill-compress"} if KVPRESS else {"stream"}
    for p in protocols:
        ref = rows[("dynamic-f32 (%s)" % p, p)]
        assert ref["reference"] and ref["ppl_delta_pct"] == 0 and ref["kl_mean"] == 0
        assert ref["top1_agreement"] == 1 and abs(ref["bits_per_element"] - 32) < 1e-9
        assert abs(ref["memory_vs_f16"] - 0.5) < 1e-9  # f32 holds twice the dense f16 bytes
    for name in ROWS:
        r = next(x for x in rep["results"] if x["strategy"] == name)
        assert r["ppl"] > 1 and math.isfinite(r["ppl"]) and r["kl_mean"] >= 0
        assert 0 < r["top1_agreement"] <= 1 and r["ms_per_token"] > 0 and r["bits_formula"]
        assert name in stdout
    if KVPRESS:
        snap = rows[("kvpress-SnapKV@0.5", "prefill-compress")]
        # the prefill's 96 positions keep 48, the 96 decoded stay: 144 of 192 positions held
        assert abs(snap["kept_fraction"] - 144 / 192) < 1e-9
        assert abs(snap["memory_vs_f16"] - 0.5 * 192 / 144) < 1e-6  # f32 tokens, a quarter dropped
        assert snap["kl_mean"] > 1e-4  # something was evicted
        knorm = rows[("kvpress-Knorm@0.7", "prefill-compress")]
        assert abs(knorm["kept_fraction"] - (int(96 * 0.3 + 1e-9) + 96) / 192) < 0.011
        ada = rows[("kvpress-AdaKV-SnapKV@0.7", "prefill-compress")]
        # AdaKV masks 70 % of the prefill's keys per layer, head-wise, inside the dense tensors:
        # every token held, the attended share as Knorm@0.7 keeps (not counted once per head)
        assert ada["kept_fraction"] == 1.0 and abs(ada["memory_vs_f16"] - 0.5) < 1e-9
        assert abs(ada["attended_fraction"] - knorm["kept_fraction"]) < 0.011, ada["attended_fraction"]
        for r in rep["results"]:
            assert 0 < r["attended_fraction"] <= r["kept_fraction"] <= 1, r
        ours = rows[("ours:snapkv:budget=0.5+f32", "prefill-compress")]
        assert abs(ours["kept_fraction"] - 144 / 192) < 1e-9
    else:
        f32 = rows[("ours:f32", "stream")]
        # our f32 pool through transformers' forward pass is the dense cache, up to summation order
        assert f32["kl_mean"] < 1e-8 and abs(f32["ppl_delta_pct"]) < 1e-3
        assert abs(f32["bits_per_element"] - 32) < 1e-9
        int8 = rows[("ours:int8:per-token", "stream")]
        assert 8 < int8["bits_per_element"] < 9 and 1e-7 < int8["kl_mean"] < 1e-2
        q4 = rows[("quanto-int4", "stream")]
        # 192 tokens: 128 quantized at the 128th update, 64 residual in f32 (2 x 64 x (4 + 1) + 64 x 32 bits)
        assert 10 < q4["bits_per_element"] < 17, q4["bits_per_element"]
        h4 = rows[("hqq-int4-r32", "stream")]
        assert h4["bits_per_element"] < q4["bits_per_element"]  # a shorter f32 residual
        assert q4["kl_mean"] > int8["kl_mean"]


def test_eval_prints_the_report(report):
    path, rep, _ = report
    r = subprocess.run([cli(), "eval", "--model", "smollm2", "--ctx", str(CTX), "--max-tokens", str(CTX - 1),
                        "--strategies", "f16", "--no-progress", "--peer", path], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    side = r.stdout.split("side by side with", 1)
    assert len(side) == 2, r.stdout
    for name in ROWS:
        assert name in side[1]
    j = subprocess.run([cli(), "eval", "--model", "smollm2", "--ctx", str(CTX), "--max-tokens", str(CTX - 1),
                        "--strategies", "f16", "--no-progress", "--json", "--peer", path], capture_output=True,
                       text=True, timeout=300)
    ours = json.loads(j.stdout)
    assert ours["token_ids_sha256"] == rep["token_ids_sha256"]
    assert ours["peer"]["results"] == rep["results"]


@pytest.mark.parametrize("change,message", [
    (lambda j: j.update(model="other-model.gguf"), "was measured on model 'other-model.gguf'"),
    (lambda j: j.update(token_ids_sha256="0" * 64), "scored different token ids"),
    (lambda j: j.update(token_ids_count=CTX + 1), "read %d token ids of the text" % (CTX + 1)),
    (lambda j: j.update(ctx=CTX * 2), "used windows of %d positions" % (CTX * 2)),
    (lambda j: j["results"][0].pop("kl_mean"), "result 0 lacks 'kl_mean'"),
    (lambda j: j["results"][1].update(ppl="x"), "'ppl' is not a number"),
    (lambda j: j.pop("model"), "lacks 'model'"),
])
def test_eval_refuses_a_bad_report(report, tmp_path, change, message):
    _, rep, _ = report
    bad = json.loads(json.dumps(rep))
    change(bad)
    path = str(tmp_path / "bad.json")
    with open(path, "w") as f:
        json.dump(bad, f)
    r = subprocess.run([cli(), "eval", "--model", "smollm2", "--ctx", str(CTX), "--max-tokens", str(CTX - 1),
                        "--strategies", "f16", "--no-progress", "--peer", path], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0 and r.returncode < 128
    assert message in r.stderr, r.stderr
    assert "side by side" not in r.stdout


def test_needle_short(tmp_path):
    """bench/peers/needle.py on one 384-token context: the dense reference finds the needle, the
    report holds one trial per row with the number it looked for."""
    out = str(tmp_path / "needle.json")
    row = "kvpress-Knorm@0.5" if KVPRESS else "ours:int8:per-token"
    r = subprocess.run([sys.executable, os.path.join(hfmodel.ROOT, "bench", "peers", "needle.py"), "--rows", row,
                        "--lengths", "384", "--depths", "0.5", "--seeds", "1", "--threads", "1", "--json", out],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(out) as f:
        rep = json.load(f)
    assert [x["strategy"] for x in rep["results"]] == ["dynamic-f32", row]
    dense = rep["results"][0]
    assert dense["pass_rate"] == 1.0 and len(dense["trials"]) == 1, dense["trials"]
    t = dense["trials"][0]
    assert str(t["number"]) in t["answer"] and t["length"] == 384
    assert rep["results"][1]["trials"][0]["number"] == t["number"]  # the same context for every row
    if KVPRESS:
        assert rep["results"][1]["kept_fraction"] < 0.6  # half the context dropped


if not KVPRESS:  # once, in the hf venv (a pytest skip counts as a failure here)
    def test_stop_and_resume_equals_one_run(tmp_path):
        """--stop-after 1 then --resume gives the report of one uninterrupted run (three windows)."""
        args = [sys.executable, SCRIPT, "--rows", "ours:int8:per-token", "--ctx", "32", "--max-tokens", "93",
                "--threads", "1"]
        one, parts = str(tmp_path / "one.json"), str(tmp_path / "parts.json")
        r = subprocess.run(args + ["--json", one], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        r = subprocess.run(args + ["--json", parts, "--stop-after", "1"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "--resume" in r.stderr, r.stderr[-3000:]
        assert not os.path.exists(parts) and os.path.exists(parts + ".partial")
        with open(parts + ".partial") as f:
            part = json.load(f)
        assert part["complete"] is False and part["windows"] == 1 and part["state"]["windows_done"] == 1
        bad = subprocess.run(args[:-2] + ["--threads", "1", "--max-tokens", "62", "--json", parts, "--resume"],
                             capture_output=True, text=True, timeout=300)
        assert bad.returncode != 0 and "not a checkpoint of this work" in bad.stderr, bad.stderr[-2000:]
        r = subprocess.run(args + ["--json", parts, "--resume"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "resuming after window 1/3" in r.stderr, r.stderr[-3000:]
        assert not os.path.exists(parts + ".partial")
        with open(one) as f, open(parts) as g:
            a, b = json.load(f), json.load(g)
        assert a["windows"] == b["windows"] == 3 and a["token_ids_sha256"] == b["token_ids_sha256"]
        for x, y in zip(a["results"], b["results"]):
            for k in ("strategy", "ppl", "kl_mean", "top1_agreement", "bits_per_element", "kept_fraction",
                      "peak_kv_bytes"):
                assert x[k] == y[k], (k, x[k], y[k])
