"""Contract tests of kvcache.vllm.KvcConnector against vLLM's own classes.

vLLM (pinned in scripts/setup-python.sh, docs/engines.md) is installed
--no-deps beside a torch it does not pin: its compiled ops (vllm._C) do not
load, and nothing here needs them. Nothing of vLLM is stubbed: the scheduler
is vLLM's own ``Scheduler`` (its KV cache manager, prefix cache and
connector calls), the connectors are made by vLLM's ``KVConnectorFactory``
from ``kv_connector_module_path``, the configuration is a real ``VllmConfig``
of a small Llama (a config.json written by the test). The only stand-in is
the model's forward on the worker: ``Engine.step`` calls the worker-side
connector in the order vLLM's model runner does (handle_preemptions,
bind_connector_metadata, start_load_kv before the forward when the step has
sync loads, per layer wait_for_layer_load and save_kv_layer, wait_for_save,
get_transfer_results, get_block_ids_with_load_errors,
clear_connector_metadata) and writes each computed position's K/V into CPU
tensors shaped as vLLM's paged layers ([blocks, KV heads, block size,
2 x head size]) by slot mapping. K/V values are a function of the token,
its position, the layer and the channel, so a loaded block is checked
against what a forward would have written.
"""
import json
import os

import pytest
import torch

from engine_util import free_port, redis_ports

from vllm import SamplingParams  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig,  # noqa: E402
                         VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.forward_context import get_forward_context, set_forward_context  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from kvcache.vllm import KvcConnector  # noqa: E402

LAYERS = ["model.layers.%d.self_attn.attn" % i for i in range(3)]
KV_HEADS, HEAD, BS, EOS = 2, 8, 16, 2
init_none_hash(sha256)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    with open(d / "config.json", "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
                   "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": KV_HEADS,
                   "head_dim": HEAD, "num_hidden_layers": len(LAYERS), "vocab_size": 1000,
                   "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "float16",
                   "bos_token_id": 1, "eos_token_id": EOS}, f)
    return str(d)


def kv_value(tok, pos, layer):
    """What the fake forward writes for one position: [KV heads, 2 x head] (K then V channels)."""
    h = torch.arange(KV_HEADS, dtype=torch.float32).view(-1, 1)
    c = torch.arange(2 * HEAD, dtype=torch.float32).view(1, -1)
    return (((tok * 31 + pos * 7 + layer * 13) % 97) + h * 0.25 + c / 64).to(torch.float16)


class Engine:
    """vLLM's scheduler and one worker's connector, with a fake forward."""

    def __init__(self, model_dir, extra, num_blocks=48, policy="recompute", max_batched=64):
        sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=max_batched, max_model_len=2048,
                             enable_chunked_prefill=True, is_encoder_decoder=False)
        cc = CacheConfig(block_size=BS, gpu_memory_utilization=0.9, enable_prefix_caching=True)
        kt = KVTransferConfig(kv_connector="KvcConnector", kv_connector_module_path="kvcache.vllm",
                              kv_role="kv_both", kv_connector_extra_config=dict(extra),
                              kv_load_failure_policy=policy)
        mc = ModelConfig(model=model_dir, dtype="float16", seed=0, skip_tokenizer_init=True)
        self.vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc, kv_transfer_config=kt,
                             device_config=DeviceConfig("cpu"))
        self.kcc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(list(LAYERS), FullAttentionSpec(block_size=BS, num_kv_heads=KV_HEADS,
                                                             head_size=HEAD, dtype=torch.float16))])
        self.vc.cache_config.num_gpu_blocks = num_blocks
        self.num_blocks = num_blocks
        self.sched = Scheduler(vllm_config=self.vc, kv_cache_config=self.kcc, log_stats=True,
                               structured_output_manager=StructuredOutputManager(self.vc), block_size=BS)
        self.worker = KVConnectorFactory.create_connector(self.vc, KVConnectorRole.WORKER, self.kcc)
        self.kv = {n: torch.zeros(num_blocks, KV_HEADS, BS, 2 * HEAD, dtype=torch.float16) for n in LAYERS}
        self.worker.register_kv_caches(self.kv)
        self.computed = {}  # req_id -> positions the fake forward computed
        self.tokens = {}  # req_id -> every token (prompt + output)
        self.between = None  # a hook called between schedule() and the worker's step
        self.finished = []
        self.finish_reasons = {}
        self.invalid = set()  # every block id the worker reported as failed to load

    def add(self, rid, prompt, max_tokens=3):
        sp = SamplingParams(max_tokens=max_tokens)
        sp.update_from_generation_config({}, EOS)
        req = Request(request_id=rid, prompt_token_ids=list(prompt), sampling_params=sp, pooling_params=None,
                      block_hasher=get_request_block_hasher(BS, sha256))
        self.sched.add_request(req)
        self.tokens[rid] = list(prompt)
        self.computed[rid] = 0
        return req

    def execute(self, out):
        """The worker's half of a step (vLLM's model runner order) on scheduler output `out`;
        returns the ModelRunnerOutput."""
        meta = out.kv_connector_metadata
        w = self.worker
        w.handle_preemptions(meta)
        w.bind_connector_metadata(meta)
        if out.has_sync_kv_loads:
            with set_forward_context(None, self.vc):
                w.start_load_kv(get_forward_context())
        # The positions each request computes in this step, and their slots.
        spans = [(n.req_id, n.num_computed_tokens) for n in out.scheduled_new_reqs]
        cr = out.scheduled_cached_reqs
        spans += [(rid, cr.num_computed_tokens[i]) for i, rid in enumerate(cr.req_ids)]
        work = []
        for rid, start in spans:
            n = out.num_scheduled_tokens[rid]
            if rid not in self.sched.requests:  # aborted after schedule(): its blocks are gone
                continue
            blocks = self.sched.kv_cache_manager.get_block_ids(rid)[0]
            work.append((rid, start, blocks, n))
            self.computed[rid] += n
        for li, name in enumerate(LAYERS):
            w.wait_for_layer_load(name)
            for rid, start, blocks, n in work:
                toks = self.tokens[rid]
                # As a model's: right only on a right context (every earlier position of this
                # layer as a forward writes it), else off by one.
                ok = all(torch.equal(self.kv[name][blocks[q // BS], :, q % BS, :], kv_value(toks[q], q, li))
                         for q in range(start))
                for p in range(start, start + n):
                    self.kv[name][blocks[p // BS], :, p % BS, :] = kv_value(toks[p], p, li) + (0 if ok else 1)
            w.save_kv_layer(name, self.kv[name], object())
        w.wait_for_save()
        res = w.get_transfer_results(out.finished_req_ids)
        invalid = w.get_block_ids_with_load_errors()
        self.invalid |= invalid
        wmeta = w.build_connector_worker_meta()
        w.clear_connector_metadata()
        ids = [rid for rid, *_ in work]
        sampled = []
        for rid, start, _, n in work:
            req = self.sched.requests.get(rid)
            done = req is not None and start + n >= req.num_tokens
            sampled.append([5 + len(self.tokens[rid]) % 7] if done else [])
        for rid, smp in zip(ids, sampled):
            self.tokens[rid].extend(smp)
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                                 pooler_output=None,
                                 kv_connector_output=KVConnectorOutput(
                                     finished_sending=res.finished_sending or None,
                                     finished_recving=res.finished_recving or None,
                                     invalid_block_ids=invalid, kv_connector_worker_meta=wmeta))

    def update(self, out, mro):
        eco = self.sched.update_from_output(out, mro)
        for outs in eco.values():
            for o in outs.outputs:
                if o.finish_reason is not None:
                    self.finished.append(o.request_id)
                    self.finish_reasons[o.request_id] = o.finish_reason

    def step(self):
        out = self.sched.schedule()
        if self.between is not None:
            self.between(out)
        self.update(out, self.execute(out))
        return out

    def run(self, max_steps=200):
        for _ in range(max_steps):
            if not self.sched.requests and not self.sched.connector._finishing:
                return
            self.step()
        raise AssertionError("requests did not finish in %d steps" % max_steps)

    def check_kv(self, rid, n_positions):
        """The blocks of a live request hold what the forward writes, for its first n positions."""
        blocks = self.sched.kv_cache_manager.get_block_ids(rid)[0]
        toks = self.tokens[rid]
        for li, name in enumerate(LAYERS):
            for p in range(n_positions):
                got = self.kv[name][blocks[p // BS], :, p % BS, :]
                assert torch.equal(got, kv_value(toks[p], p, li)), (rid, name, p)

    def assert_empty(self):
        """Nothing reserved: no request, every block free (but the null block), no connector state."""
        s = self.sched
        assert not s.requests and not s.running and len(s.waiting) == 0
        assert s.kv_cache_manager.block_pool.free_block_queue.num_free_blocks == self.num_blocks - 1
        assert all(b.ref_cnt == 0 for b in s.kv_cache_manager.block_pool.blocks)
        c = s.connector
        assert not c._reqs and not c._keys and not c._lookup and not c._saved and not c._pending_loads
        assert not c._finishing and not c._unconfirmed and not c._valid_upto

    def close(self):
        self.sched.connector.shutdown()
        self.worker.shutdown()


def prompt(n, salt=0):
    return [(7 * i + 3 + salt) % 900 + 10 for i in range(n)]


def disk(tmp_path, **kw):
    return dict({"kvc_tier": "disk", "kvc_path": str(tmp_path / "store"), "kvc_capacity_bytes": 1 << 26}, **kw)


def test_connector_is_vllms(model_dir, tmp_path):
    """vLLM's factory loads the class from kv_connector_module_path, on both sides."""
    e = Engine(model_dir, disk(tmp_path))
    try:
        assert type(e.sched.connector) is KvcConnector and type(e.worker) is KvcConnector
        assert e.sched.connector.role == KVConnectorRole.SCHEDULER and e.worker.role == KVConnectorRole.WORKER
    finally:
        e.close()


def two_engines_share(model_dir, extra_a, extra_b):
    """Engine A computes a prompt and saves it; engine B (another scheduler, another worker, the same
    store) loads its full blocks, computes only the rest, and its KV equals A's."""
    a, b = Engine(model_dir, extra_a), Engine(model_dir, extra_b)
    try:
        p = prompt(70)  # 4 full blocks and 6 tokens
        a.add("a1", p)
        a.run()
        assert a.finished == ["a1"] and a.computed["a1"] == 70 + 2  # prompt, then 2 decode steps
        # A saved the full blocks of what it computed: 72 positions -> 4 blocks.
        assert a.worker.stats["blocks_saved"] == 4 and a.worker.stats["save_failures"] == 0
        a.assert_empty()

        b.add("b1", p + [901, 902], max_tokens=50)
        b.step()
        # B's scheduler counted 4 blocks (64 tokens) from the store; the forward computed the rest.
        assert b.worker.stats["blocks_loaded"] == 4 and b.worker.stats["load_failures"] == 0
        assert b.computed["b1"] == 72 - 64
        b.check_kv("b1", 72)
        b.sched.finish_requests("b1", RequestStatus.FINISHED_ABORTED)
        b.assert_empty()
        # A prompt that shares only the first two blocks loads those two (vLLM's own prefix cache,
        # which still holds b1's blocks, emptied first).
        assert b.sched.reset_prefix_cache()
        q = p[:40] + prompt(30, salt=5)
        b.add("b2", q)
        b.step()
        assert b.worker.stats["blocks_loaded"] == 4 + 2 and b.computed["b2"] == 70 - 32
        b.check_kv("b2", 70)
        b.run()
        b.assert_empty()
    finally:
        a.close()
        b.close()


def test_two_engines_share_disk(model_dir, tmp_path):
    two_engines_share(model_dir, disk(tmp_path), disk(tmp_path))


def test_host_tier_shared_in_process(model_dir, tmp_path):
    # The host tier is this process's memory: two connectors of one process see one store.
    ext = {"kvc_tier": "host", "kvc_capacity_bytes": 1 << 24, "kvc_scope": str(tmp_path)}
    two_engines_share(model_dir, ext, ext)


def test_local_prefix_hit_then_store(model_dir, tmp_path):
    """vLLM's own prefix cache answers first; the connector adds only blocks past its hit, and a
    repeated prompt is not written again."""
    e = Engine(model_dir, disk(tmp_path))
    try:
        p = prompt(50)
        e.add("r1", p)
        e.run()
        saved = e.worker.stats["blocks_saved"]
        assert saved == 3
        e.add("r2", p)  # vLLM's prefix cache still holds r1's blocks
        e.step()
        assert e.worker.stats["blocks_loaded"] == 0 and e.computed["r2"] == 50 - 48
        e.check_kv("r2", 50)
        e.run()
        assert e.worker.stats["blocks_saved"] == saved  # nothing new
        e.assert_empty()
    finally:
        e.close()


def test_chunked_prefill_saves_each_step(model_dir, tmp_path):
    """A prompt longer than a step's token budget is saved block by block as its chunks compute;
    a second engine loads all of it."""
    a = Engine(model_dir, disk(tmp_path), max_batched=32)
    b = Engine(model_dir, disk(tmp_path))
    try:
        p = prompt(100, salt=11)
        a.add("c1", p)
        a.step()
        assert a.worker.stats["blocks_saved"] == 2  # 32 tokens computed
        a.step()
        assert a.worker.stats["blocks_saved"] == 4
        a.run()
        assert a.worker.stats["blocks_saved"] == 6  # floor(102 / 16)
        b.add("c2", p, max_tokens=2)
        b.step()
        assert b.worker.stats["blocks_loaded"] == 6 and b.computed["c2"] == 100 - 96
        b.check_kv("c2", 100)
        b.run()
        b.assert_empty()
        a.assert_empty()
    finally:
        a.close()
        b.close()


def test_load_failure_recomputes(model_dir, tmp_path):
    """A record that vanishes between the scheduler's lookup and the worker's load: the worker reports
    the blocks from the failed one on, saves nothing the step computed for that request (its context
    was wrong), vLLM recomputes, the store ends up whole, nothing leaks."""
    a, b = Engine(model_dir, disk(tmp_path)), Engine(model_dir, disk(tmp_path))
    try:
        p = prompt(66, salt=3)
        a.add("f1", p)
        a.run()
        keys = b.sched.connector._key_pool.prefix_keys(p[:64], salt="", adapter="", media="")

        failed = []

        def drop_third(out):
            if out.has_sync_kv_loads:
                assert b.worker._store.remove(keys[2])
                failed.extend(b.sched.kv_cache_manager.get_block_ids("f2")[0][2:4])
                b.between = None
        b.between = drop_third
        q = p[:64] + prompt(40, salt=9)  # 4 stored blocks, then 40 new tokens (2 more full blocks)
        b.add("f2", q)
        b.step()
        assert b.worker.stats["load_failures"] == 1 and b.worker.stats["blocks_loaded"] == 2
        assert b.invalid == set(failed)  # blocks 2 and 3 reported to vLLM
        assert b.computed["f2"] == 40 and b.worker.stats["blocks_saved"] == 0  # blocks 4, 5 not saved
        b.run()
        assert b.finished == ["f2"]
        # vLLM recomputed from block 2 on: 40 + (104 - 32) prompt tokens, then 2 decode steps.
        assert b.computed["f2"] == 40 + (104 - 32) + 2
        assert b.worker.stats["blocks_saved"] == 4  # blocks 2 to 5 (block 3 again: it was in the failed load)
        b.assert_empty()
        all_keys = b.sched.connector._key_pool.prefix_keys(q, salt="", adapter="", media="")
        assert b.worker._store.contains(all_keys) == [True] * 6
    finally:
        a.close()
        b.close()


def test_load_failure_policy_fail(model_dir, tmp_path):
    """With kv_load_failure_policy "fail", vLLM ends the request with an error; nothing leaks."""
    a, b = Engine(model_dir, disk(tmp_path)), Engine(model_dir, disk(tmp_path), policy="fail")
    try:
        p = prompt(40, salt=8)
        a.add("g1", p)
        a.run()
        keys = b.sched.connector._key_pool.prefix_keys(p[:32], salt="", adapter="", media="")

        def drop(out):
            if out.has_sync_kv_loads:
                b.worker._store.remove(keys[0])
                b.between = None
        b.between = drop
        b.add("g2", p)
        b.run()
        assert b.worker.stats["load_failures"] == 1
        assert str(b.finish_reasons["g2"]) == "error"  # vLLM ended the request
        b.assert_empty()
    finally:
        a.close()
        b.close()


def test_shared_blocks_of_a_failed_load_never_saved(model_dir, tmp_path):
    """x loads blocks 0-3 from the store; y, in the same step, takes vLLM's own prefix hit on those
    blocks while they load and computes its blocks 4 and 5 on top. x's block 2 fails: nothing y
    computed on it is saved; vLLM recomputes both; a third engine loading y's prompt from the
    store gets right K/V (the forward here writes wrong values on a wrong context)."""
    a = Engine(model_dir, disk(tmp_path))
    b, c = Engine(model_dir, disk(tmp_path), max_batched=128), Engine(model_dir, disk(tmp_path), max_batched=128)
    try:
        p = prompt(66, salt=3)
        a.add("a", p)
        a.run()
        keys = b.sched.connector._key_pool.prefix_keys(p[:64], salt="", adapter="", media="")

        def drop(out):
            if out.has_sync_kv_loads:
                assert b.worker._store.remove(keys[2])
                b.between = None
        b.between = drop
        x, y = p[:64] + prompt(40, salt=9), p[:64] + prompt(40, salt=19)
        b.add("x", x, max_tokens=2)
        b.add("y", y, max_tokens=2)
        b.step()
        assert b.worker.stats["load_failures"] == 1 and b.worker.stats["blocks_saved"] == 0
        b.run()
        b.assert_empty()
        c.add("y2", y, max_tokens=3)
        c.step()
        assert c.worker.stats["blocks_loaded"] == 6 and c.computed["y2"] == 104 - 96
        c.check_kv("y2", 104)
    finally:
        a.close()
        b.close()
        c.close()


def test_async_scheduling_failed_load(model_dir, tmp_path):
    """vLLM's async scheduling plans step N+1 before step N's output is in. x's load fails in
    step N; step N+1 computes x's next blocks on that context: they are not saved then, and vLLM's
    recomputation is; an engine loading x's prompt gets right K/V."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    a = Engine(model_dir, disk(tmp_path))
    b = Engine(model_dir, disk(tmp_path), max_batched=64)
    e = Engine(model_dir, disk(tmp_path), max_batched=256)
    try:
        b.sched.connector.shutdown()
        b.vc.scheduler_config.async_scheduling = True
        b.sched = AsyncScheduler(vllm_config=b.vc, kv_cache_config=b.kcc, log_stats=True,
                                 structured_output_manager=StructuredOutputManager(b.vc), block_size=BS)
        p = prompt(66, salt=4)
        a.add("a", p)
        a.run()
        keys = b.sched.connector._key_pool.prefix_keys(p[:64], salt="", adapter="", media="")
        x = p[:64] + prompt(100, salt=29)  # 164 tokens
        b.add("x", x, max_tokens=2)
        out1 = b.sched.schedule()
        assert out1.has_sync_kv_loads
        assert b.worker._store.remove(keys[2])
        mro1 = b.execute(out1)
        out2 = b.sched.schedule()  # N+1, before N's output is in
        assert not out2.kv_connector_metadata.saves
        b.update(out1, mro1)
        b.update(out2, b.execute(out2))
        b.run()
        assert b.worker.stats["load_failures"] == 1
        b.assert_empty()
        e.add("x2", x, max_tokens=3)
        e.step()
        assert e.worker.stats["blocks_loaded"] == 10
        e.check_kv("x2", 164)
    finally:
        a.close()
        b.close()
        e.close()


def test_finish_in_the_load_step(model_dir, tmp_path):
    """A request that ends in the step that loads its prefix: its new blocks are saved in the next
    step (once the load is confirmed), vLLM holding them until finished_sending; nothing leaks."""
    a, b, c = (Engine(model_dir, disk(tmp_path), max_batched=256) for _ in range(3))
    try:
        p = prompt(66, salt=6)
        a.add("a", p)
        a.run()
        q = p[:64] + prompt(40, salt=7)
        b.add("f", q, max_tokens=1)
        b.step()
        assert b.finished == ["f"] and b.worker.stats["blocks_loaded"] == 4
        assert b.worker.stats["blocks_saved"] == 0 and "f" in b.sched.connector._finishing
        b.run()
        assert b.worker.stats["blocks_saved"] == 2  # blocks 4 and 5
        b.assert_empty()
        c.add("f2", q, max_tokens=2)
        c.step()
        assert c.worker.stats["blocks_loaded"] == 6
        c.check_kv("f2", 104)
    finally:
        a.close()
        b.close()
        c.close()


def test_keys_and_scope_separate(model_dir, tmp_path):
    """LoRA adapters of one name at two paths, multimodal identifier lists that would join alike,
    a quantized deployment of the same checkpoint: never the same keys or scope; odd salts degrade
    to an uncached request, never an exception into vLLM."""
    from types import SimpleNamespace as NS
    e = Engine(model_dir, disk(tmp_path))
    try:
        c = e.sched.connector
        toks = prompt(40)

        def req(rid, **kw):
            r = NS(request_id=rid, all_token_ids=toks, num_tokens=len(toks), prompt_embeds=None,
                   lora_request=None, mm_features=None, cache_salt=None)
            r.__dict__.update(kw)
            return r
        k = lambda r: c._request_keys(r, 2)  # noqa: E731
        assert k(req("1", lora_request=NS(lora_name="sql", lora_path="/a/v1"))) != \
            k(req("2", lora_request=NS(lora_name="sql", lora_path="/a/v2")))
        assert k(req("3", mm_features=[NS(identifier="a|b")])) != \
            k(req("4", mm_features=[NS(identifier="a"), NS(identifier="b")]))
        assert k(req("5", cache_salt="x")) != k(req("6"))
        assert c.get_num_new_matched_tokens(req("7", cache_salt="\ud800"), 0) == (0, False)
        big = req("8", cache_salt="s" * (2 << 20))  # larger than an extra key may be
        assert c.get_num_new_matched_tokens(big, 0) == (0, False)
        scope = c._scope(0, 0)
        e.vc.model_config.quantization = "fp8"
        assert c._scope(0, 0) != scope
    finally:
        e.close()


def test_abort_leaves_nothing_reserved(model_dir, tmp_path):
    a, b = Engine(model_dir, disk(tmp_path), max_batched=16), Engine(model_dir, disk(tmp_path))
    try:
        p = prompt(64, salt=21)
        a.add("x1", p)
        a.step()
        a.sched.finish_requests("x1", RequestStatus.FINISHED_ABORTED)  # mid-prefill
        a.step()
        a.assert_empty()
        assert a.worker.stats["blocks_saved"] == 1
        # A request aborted after its load was planned, before it ran.
        a.add("x2", p)
        a.run()
        b.add("x3", p)

        def abort(out):  # the step is planned (a load of x3), then the client goes away
            assert out.has_sync_kv_loads
            b.sched.finish_requests("x3", RequestStatus.FINISHED_ABORTED)
            b.between = None
        b.between = abort
        b.step()
        # x3 computed its last 16 tokens in that step (block 3): vLLM holds its blocks until the
        # next step has saved that block (finished_sending), then frees them.
        assert "x3" in b.sched.connector._finishing
        out = b.step()
        assert [(sv.req_id, sv.last) for sv in out.kv_connector_metadata.saves] == [("x3", True)]
        b.assert_empty()
        out = b.step()  # the next step carries nothing of x3
        assert not out.kv_connector_metadata.loads and not out.kv_connector_metadata.saves
        b.assert_empty()
    finally:
        a.close()
        b.close()


def test_tier_down_degrades_to_misses(model_dir):
    """A Redis server nobody runs: every lookup misses, saves fail quietly, requests complete."""
    ext = {"kvc_tier": "redis", "kvc_address": "127.0.0.1:%d" % free_port(), "kvc_timeout_ms": 200}
    e = Engine(model_dir, ext)
    try:
        e.add("d1", prompt(40))
        e.run()
        assert e.finished == ["d1"] and e.computed["d1"] == 42
        assert e.worker.stats["save_failures"] == 2 and e.worker.stats["blocks_saved"] == 0
        e.assert_empty()
    finally:
        e.close()


def test_scopes_and_extra_keys_never_share(model_dir, tmp_path):
    """Another deployment scope or cache salt never reads another's blocks."""
    a = Engine(model_dir, disk(tmp_path))
    b = Engine(model_dir, disk(tmp_path, kvc_scope="other-deployment"))
    try:
        p = prompt(50, salt=40)
        a.add("s1", p)
        a.run()
        b.add("s2", p)
        b.step()
        assert b.worker.stats["blocks_loaded"] == 0 and b.computed["s2"] == 50
        b.run()
        sp = SamplingParams(max_tokens=2)
        sp.update_from_generation_config({}, EOS)
        req = Request(request_id="s3", prompt_token_ids=p, sampling_params=sp, pooling_params=None,
                      cache_salt="tenant-9", block_hasher=get_request_block_hasher(BS, sha256))
        a.sched.add_request(req)
        a.tokens["s3"], a.computed["s3"] = list(p), 0
        a.sched.reset_prefix_cache()  # so vLLM's own cache does not answer
        before = a.worker.stats["blocks_loaded"]
        a.step()
        assert a.worker.stats["blocks_loaded"] == before and a.computed["s3"] == 50
        a.run()
        a.assert_empty()
    finally:
        a.close()
        b.close()


def test_bad_configuration(model_dir, tmp_path):
    with pytest.raises(Exception, match="kvc_tier"):
        Engine(model_dir, {"kvc_tier": "tape"})
    with pytest.raises(Exception, match="kvc_address"):
        Engine(model_dir, {"kvc_tier": "redis"})
    with pytest.raises(Exception, match="kvc_seed"):
        Engine(model_dir, disk(tmp_path, kvc_seed="00" * 16))
    with pytest.raises(Exception, match="kvc_fsync"):
        Engine(model_dir, disk(tmp_path, kvc_fsync="maybe"))
    # A disk directory whose parents do not exist yet is made.
    deep = Engine(model_dir, disk(tmp_path, kvc_path=str(tmp_path / "a" / "b" / "c"), kvc_fsync="false"))
    deep.close()
    e = Engine(model_dir, disk(tmp_path))
    try:
        with pytest.raises(ValueError, match="none of the KV cache group"):
            e.worker.register_kv_caches({"other.layer": torch.zeros(4, 2, BS, 2 * HEAD)})
        # A wrong-sized record under a real key is a failed load, never a bad copy.
        p = prompt(40, salt=60)
        e.add("z1", p)
        e.run()
        keys = e.sched.connector._key_pool.prefix_keys(p[:32], salt="", adapter="", media="")
        e.worker._store.put(keys[0], b"short")
        e.sched.reset_prefix_cache()
        e.add("z2", p)
        e.run()
        assert e.worker.stats["load_failures"] == 1
        e.assert_empty()
    finally:
        e.close()


@pytest.mark.parametrize("kind", ["standalone", "cluster"])
def test_redis_two_engines(model_dir, kind):
    ports = redis_ports()
    if kind == "standalone":
        ext = {"kvc_tier": "redis", "kvc_address": "127.0.0.1:%d" % ports["standalone"][0]}
    else:
        ext = {"kvc_tier": "redis", "kvc_cluster": True,
               "kvc_address": ",".join("127.0.0.1:%d" % p for p in ports["cluster"])}
    ext["kvc_scope"] = "vllm-test-%d-%s" % (os.getpid(), kind)
    two_engines_share(model_dir, ext, ext)
