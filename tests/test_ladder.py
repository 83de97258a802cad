"""bcgtune.core.ladder against sglang 0.5.23: the pure re-implementations must agree with
SGLang's own functions (called directly where they run on CPU) and with the numbers
read from its source (cuda_graph_hook.py, memory_hook.py, common.py, runtime_context.py)."""

import itertools
from types import SimpleNamespace

import pytest

from bcgtune.core.ladder import (
    ParallelLayout,
    align_buckets,
    deepep_breakable_ladder,
    default_chunked_prefill_size,
    default_prefill_max_bs,
    layout_alignment,
    layout_from_server_flags,
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
        2048, 4096, 4096, 8192, 8192, 16384, 4096,
    ]


def test_prefill_max_bs():
    assert default_prefill_max_bs(16384) == 16384
    assert default_prefill_max_bs(16384, mla_backend=True) == 8192
    assert default_prefill_max_bs(16384, pp_size=2) == 8192
    assert default_prefill_max_bs(16384, pp_size=2, breakable=False) == 16384
    assert default_prefill_max_bs(8192, max_total_tokens=5000) == 5000
    assert default_prefill_max_bs(16384, attn_dp_size=4) == 4096


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
    lay = layout_from_server_flags({"--tp-size": 8, "--attn-dp-size": 2, "--moe-a2a-backend": "deepep",
                                    "--enable-two-batch-overlap": True})
    assert layout_alignment(lay) == 8
    with pytest.raises(InputError):
        layout_from_server_flags({"tp_size": 6, "attn_dp_size": 4})
    with pytest.raises(InputError):
        layout_from_server_flags({"tp_size": 8, "dp_size": 2, "attn_dp_size": 2})
    with pytest.raises(InputError):
        layout_from_server_flags({"tp_size": "two"})


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

    import sglang.srt.utils.common as common
    from sglang.srt.runtime_context import derive_attn_tp_size

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
        lay = ParallelLayout(tp=tp, attn_dp=adp, attn_cp_size=cp, two_batch_overlap=tbo, moe_a2a_backend=a2a,
                             moe_dense_tp_size=dense, enable_dp_lm_head=lmh, disable_attn_tp_gather=noatg, is_hip=hip)
        par = SimpleNamespace(
            attn_dp_enabled=adp > 1, num_dp_ranks=adp, tp_size=tp, moe_dense_tp_size=dense,
            enable_dp_lm_head=lmh, disable_attn_tp_gather=noatg, attn_cp_size=cp,
            attn_tp_size=derive_attn_tp_size(tp_size=tp, attn_cp_size=cp, attn_dp_size=adp),
        )
        exe = SimpleNamespace(overlap=SimpleNamespace(enable_two_batch_overlap=tbo),
                              moe=SimpleNamespace(elastic_ep_backend=None))
        monkeypatch.setattr(common, "get_parallel", lambda par=par: par)
        monkeypatch.setattr(common, "get_exec", lambda exe=exe: exe)
        monkeypatch.setattr(common, "is_hip", lambda hip=hip: hip)
        monkeypatch.setattr(moe_utils, "get_moe_a2a_backend", lambda a2a=a2a: FakeA2A(a2a))
        assert lay.attn_tp_size == par.attn_tp_size
        assert layout_alignment(lay) == common.get_cuda_graph_batch_size_alignment(), lay
        checked += 1
    assert checked > 300
