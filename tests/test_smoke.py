from bcgtune.core.sglang.ladder import sglang_default_ladder


def test_default_ladder_sizes_match_sglang_counts():
    assert [len(sglang_default_ladder(m)) for m in (2048, 4096, 8192, 16384)] == [42, 50, 58, 74]
