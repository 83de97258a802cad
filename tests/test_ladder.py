"""bcgtune.core.sglang.ladder against sglang 0.5.23: the pure re-implementations must agree with
SGLang's own functions (called directly where they run on CPU) and with the numbers
read from its source (cuda_graph_hook.py, memory_hook.py, common.py, runtime_context.py)."""

import itertools
from types import SimpleNamespace

import pytest

from bcgtune.adapters.sglang.flags import (
    layout_from_server_flags,
    prefill_launch_from_server_flags,
)
from bcgtune.core.sglang.capture import PrefillLaunch, resolve_prefill_capture
from bcgtune.core.sglang.ladder import (
    ParallelLayout,
    align_buckets,
    deepep_breakable_ladder,
    default_chunked_prefill_size,
    layout_alignment,
    sglang_default_ladder,
)
from bcgtune.errors import InputError


def test_ladder_counts_and_shape():
    assert [len(sglang_default_ladder(m)) for m in (2048, 4096, 8192, 16384)] == [42, 50, 58, 74]
    lad = sglang_default_ladder(16384)
    assert lad[:3] == [4, 8, 12] and lad[-1] == 16384
    assert sglang_default_ladder(1000)[-1] == 960
    with pytest.raises(InputError):
        sglang_default_ladder(0)


def test_deepep_ladder_multiples_of_8():
    lad = deepep_breakable_ladder()
    assert all(b % 8 == 0 for b in lad) and lad[0] == 8 and lad[-1] == 2048
    assert deepep_breakable_ladder(4096)[-1] == 4096


def test_chunked_prefill_defaults():
    assert [default_chunked_prefill_size(g) for g in (16, 24, 40, 80, 141, 288, None)] == [
        2048,
        4096,
        4096,
        8192,
        8192,
        16384,
        4096,
    ]


def test_prefill_max_bs():
    def max_bs(chunk, **kw):
        return resolve_prefill_capture(PrefillLaunch(chunked_prefill_size=chunk, **kw)).max_bs

    assert max_bs(16384) == 16384
    assert max_bs(16384, mla=True) == 8192
    assert max_bs(16384, pp_size=2, backend="breakable") == 8192
    assert max_bs(16384, pp_size=2, backend="full") == 16384
    assert max_bs(8192, max_total_tokens=5000) == 5000
    assert max_bs(16384, layout=ParallelLayout(tp=4, attn_dp=4)) == 4096


def test_alignment_cases():
    assert layout_alignment(ParallelLayout(tp=2)) == 1  # plain TP/EP
    assert layout_alignment(ParallelLayout(tp=2, two_batch_overlap=True)) == 2
    # deprecated spelling: --tp 8 --dp 2 --enable-dp-attention -> attn_dp 2, attn_tp 4
    assert layout_alignment(ParallelLayout(tp=8, dp=2, enable_dp_attention=True)) == 4
    assert layout_alignment(ParallelLayout(tp=8, attn_dp=2)) == 4
    assert layout_alignment(ParallelLayout(tp=8, attn_dp=8)) == 1  # pure DP attention
    assert layout_alignment(ParallelLayout(tp=4, moe_a2a_backend="deepep")) == 4
    # context parallel: attn_tp = tp / cp; off HIP x cp unless already a multiple
    assert layout_alignment(ParallelLayout(tp=4, attn_cp_size=2)) == 2
    assert layout_alignment(ParallelLayout(tp=4, attn_cp_size=2, is_hip=True)) == 1
    assert layout_alignment(ParallelLayout(tp=4, attn_cp_size=2, two_batch_overlap=True)) == 2
    assert align_buckets([250, 256, 500], 4) == [252, 256, 500]


def test_layout_from_flags():
    lay = layout_from_server_flags({"tp-size": 2, "ep-size": 2, "attention-backend": "aiter"}, is_hip=True)
    assert (lay.tp, lay.attn_tp_size, layout_alignment(lay)) == (2, 2, 1)
    lay = layout_from_server_flags({"tensor_parallel_size": 8, "dp_size": 4, "enable_dp_attention": True})
    assert (lay.attn_dp_size, lay.replica_dp_size, lay.attn_tp_size) == (4, 1, 2)
    lay = layout_from_server_flags(
        {"--tp-size": 8, "--attn-dp-size": 2, "--moe-a2a-backend": "deepep", "--enable-two-batch-overlap": True}
    )
    assert layout_alignment(lay) == 8
    with pytest.raises(InputError):
        layout_from_server_flags({"tp_size": 6, "attn_dp_size": 4})
    with pytest.raises(InputError):
        layout_from_server_flags({"tp_size": 8, "dp_size": 2, "attn_dp_size": 2})
    with pytest.raises(InputError):
        layout_from_server_flags({"tp_size": "two"})
    # SGLang's short flags are the same flags
    assert layout_from_server_flags({"tp": 8, "dp": 8, "enable-dp-attention": True}).attn_dp_size == 8


# ---------------------------------------------------------------- where the rules combine
def _cap(flags=None, **kw):
    return resolve_prefill_capture(prefill_launch_from_server_flags(flags or {}, **kw))


def test_capture_defaults_by_platform():
    c = _cap(gpu_memory_gib=141)
    assert (c.backend, c.buckets, c.max_bs, len(c.captured), c.captured[-1]) == ("breakable", None, 8192, 58, 8192)
    assert "default on CUDA" in c.reason
    c = _cap(platform="rocm", gpu_memory_gib=288)
    assert c.backend == "disabled" and c.captured == () and "opt-in" in c.reason
    c = _cap({"cuda-graph-backend-prefill": "breakable"}, platform="rocm", gpu_memory_gib=288)
    assert (c.backend, len(c.captured), c.max_bs) == ("breakable", 74, 16384)


def test_capture_auto_disable_rules():
    assert "two-batch overlap" in _cap({"enable-two-batch-overlap": True}).reason
    for a2a in ("mooncake", "nixl", "mori", "pplx"):
        c = _cap({"moe-a2a-backend": a2a, "tp": 2})
        assert c.backend == "disabled" and a2a in c.reason, a2a
    c = _cap({"pp-size": 2})
    assert c.backend == "disabled" and "pipeline parallelism" in c.reason
    # an explicit backend skips those rules ...
    c = _cap({"enable-two-batch-overlap": True, "cuda-graph-backend-prefill": "breakable", "tp": 2})
    assert (c.backend, c.alignment) == ("breakable", 2)
    c = _cap({"pp-size": 2, "cuda-graph-backend-prefill": "breakable"}, gpu_memory_gib=288)
    assert (c.backend, c.max_bs) == ("breakable", 8192)  # PP caps the ladder at 8192
    # ... but not DeepEP v2 or DeepEP normal dispatch
    c = _cap({"moe-a2a-backend": "deepep_v2", "cuda-graph-backend-prefill": "breakable"})
    assert c.backend == "disabled" and "DeepEP v2" in c.reason
    c = _cap({"moe-a2a-backend": "deepep", "deepep-mode": "normal", "cuda-graph-backend-prefill": "breakable"})
    assert c.backend == "disabled" and "normal" in c.reason
    c = _cap({"disable-prefill-cuda-graph": True}, buckets=[256])
    assert c.backend == "disabled" and c.captured == ()


def test_capture_deepep_rounding_and_regeneration():
    c = _cap({"moe-a2a-backend": "deepep"}, buckets=[100, 300, 1000, 3000])
    assert c.captured == (104, 304, 1000, 3000) and c.buckets == (104, 304, 1000, 3000)
    assert "100->104, 300->304" in c.notes[0]
    c = _cap({"moe-a2a-backend": "deepep"}, gpu_memory_gib=141)
    assert c.captured == tuple(deepep_breakable_ladder()) and c.max_bs == 2048
    # DeepEP + attention DP with a chunk per rank below 2048: the plain ladder to 1024
    c = _cap({"tp": 8, "dp": 8, "enable-dp-attention": True, "moe-a2a-backend": "deepep", "chunked-prefill-size": 8192})
    assert (len(c.captured), c.captured[0], c.captured[-1], c.max_bs, c.buckets) == (38, 4, 1024, 1024, None)
    assert any("regenerates the plain ladder" in n for n in c.notes)
    # an explicit list is rounded but never regenerated
    c = _cap(
        {"tp": 8, "dp": 8, "enable-dp-attention": True, "moe-a2a-backend": "deepep", "chunked-prefill-size": 8192},
        buckets=[100, 3000],
    )
    assert c.captured == (104, 3000)


def test_capture_ladder_maximum_per_layout():
    assert _cap({"tp": 8, "dp": 8, "enable-dp-attention": True, "chunked-prefill-size": 8192}).max_bs == 1024
    assert _cap({"chunked-prefill-size": 16384}, mla=True).max_bs == 8192
    assert _cap({"chunked-prefill-size": 16384}, model_path="meta-llama/Llama-2-70b-hf").max_bs == 4096
    assert _cap({"max-total-tokens": 5000}, gpu_memory_gib=141).max_bs == 5000
    assert _cap({"moe-a2a-backend": "deepep", "chunked-prefill-size": 16384}).max_bs == 2048
    # an explicit max is not clamped by attention DP
    assert (
        _cap({"tp": 8, "attn-dp-size": 8, "cuda-graph-max-bs-prefill": 4096, "chunked-prefill-size": 8192}).captured[-1] == 4096
    )


def test_capture_chunked_prefill_off_means_no_graphs():
    c = _cap({"chunked-prefill-size": -1})
    assert (c.backend, c.captured, c.buckets) == ("disabled", (), None)
    assert "--chunked-prefill-size -1" in c.reason and "disables prefill CUDA graphs" in c.reason
    # an explicit list does not depend on the chunk
    assert _cap({"chunked-prefill-size": -1}, buckets=[64, 128]).captured == (64, 128)
    # SGLang accepts 0 as well: no ladder, so no graphs (checked against SGLang in
    # tests/test_sglang_resolve.py)
    c = _cap({"chunked-prefill-size": 0})
    assert (c.backend, c.captured) == ("disabled", ()) and "--chunked-prefill-size 0" in c.reason


def test_capture_explicit_lists_unsorted_duplicate_unaligned():
    c = _cap({"tp": 8, "attn-dp-size": 2}, buckets=[512, 256, 256, 102])
    assert (c.alignment, c.captured) == (4, (104, 256, 512))
    assert c.buckets == (512, 256, 256, 102)  # as resolved: SGLang sorts at capture


def test_capture_rejects_unknown_backend():
    with pytest.raises(InputError):
        resolve_prefill_capture(PrefillLaunch(backend="piecewise"))


# ---------------------------------------------------------------- against the real source


@pytest.mark.sglang
def test_ladder_matches_sglang():
    # cuda_graph_hook pulls sglang.srt.connector (safetensors, ...), beyond ServerArgs' list
    hook = pytest.importorskip("sglang.srt.arg_groups.cuda_graph_hook")
    generate_prefill_cuda_graph_batch_sizes = hook.generate_prefill_cuda_graph_batch_sizes

    for m in (1, 4, 100, 1000, 2048, 4096, 5376, 8192, 10000, 16384, 32768):
        assert sglang_default_ladder(m) == generate_prefill_cuda_graph_batch_sizes(m)


@pytest.mark.sglang
def test_alignment_matches_sglang(monkeypatch):
    pytest.importorskip("sglang.srt.server_args")
    import sys

    from sglang.srt.runtime_context import derive_attn_tp_size
    from sglang.srt.utils import common

    # sglang.srt.layers.moe.utils imports torchvision through the model configs; the
    # alignment code only asks the backend these questions (layers/moe/utils.py).
    class FakeA2A:
        def __init__(self, name):
            self.name = name

        def is_none(self):
            return self.name == "none"

        def is_flashinfer(self):
            return self.name == "flashinfer"

        def is_mori_epv2(self):
            return False

        def is_flashinfer_megamoe(self):
            return self.name == "flashinfer_megamoe"

        def is_mori(self):
            return self.name == "mori"

    moe_utils = SimpleNamespace(get_moe_a2a_backend=None, MoeA2ABackend=FakeA2A)
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.moe.utils", moe_utils)

    checked = 0
    combos = itertools.product(
        (1, 2, 4, 8),  # tp
        (1, 2, 4),  # attn_dp
        (1, 2),  # attn_cp
        (False, True),  # tbo
        ("none", "deepep", "flashinfer"),
        (None, 1),  # moe_dense_tp_size
        (False, True),  # enable_dp_lm_head
        (False, True),  # disable_attn_tp_gather
        (False, True),  # hip
    )
    for tp, adp, cp, tbo, a2a, dense, lmh, noatg, hip in combos:
        if tp % (adp * cp):
            continue
        lay = ParallelLayout(
            tp=tp,
            attn_dp=adp,
            attn_cp_size=cp,
            two_batch_overlap=tbo,
            moe_a2a_backend=a2a,
            moe_dense_tp_size=dense,
            enable_dp_lm_head=lmh,
            disable_attn_tp_gather=noatg,
            is_hip=hip,
        )
        par = SimpleNamespace(
            attn_dp_enabled=adp > 1,
            num_dp_ranks=adp,
            tp_size=tp,
            moe_dense_tp_size=dense,
            enable_dp_lm_head=lmh,
            disable_attn_tp_gather=noatg,
            attn_cp_size=cp,
            attn_tp_size=derive_attn_tp_size(tp_size=tp, attn_cp_size=cp, attn_dp_size=adp),
        )
        exe = SimpleNamespace(overlap=SimpleNamespace(enable_two_batch_overlap=tbo), moe=SimpleNamespace(elastic_ep_backend=None))
        monkeypatch.setattr(common, "get_parallel", lambda par=par: par)
        monkeypatch.setattr(common, "get_exec", lambda exe=exe: exe)
        monkeypatch.setattr(common, "is_hip", lambda hip=hip: hip)
        monkeypatch.setattr(moe_utils, "get_moe_a2a_backend", lambda a2a=a2a: FakeA2A(a2a))
        assert lay.attn_tp_size == par.attn_tp_size
        assert layout_alignment(lay) == common.get_cuda_graph_batch_size_alignment(), lay
        checked += 1
    assert checked > 300
