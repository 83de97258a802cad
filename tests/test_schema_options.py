"""Option sets generated from what they feed: trace --simulate's options from the workload
schema, suggest-buckets' layout options from SGLang's layout flag table. Each option keeps
its field's name, so an error about a field names the option that carried it."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from cli_helpers import assert_one_line_error, cli

from bcgtune.adapters.sglang.flags import layout_from_server_flags
from bcgtune.adapters.sglang.layout_flags import LAYOUT_DEFAULTS, LAYOUT_FLAGS
from bcgtune.cli.commands.trace import SimulateOptions
from bcgtune.cli.options import LayoutOptions
from bcgtune.core.schema import CliOption
from bcgtune.core.sglang.ladder import ParallelLayout
from bcgtune.core.sim.workload import ClientSettings, ServerSettings, StepTimeSettings, WorkloadSettings


def _option(cls, name):
    hint = typing.get_type_hints(cls, include_extras=True)[name]
    return typing.get_args(hint)[1]


def _decls(opt) -> tuple[str, ...]:
    """The spellings of a typer option declared in Annotated (typer takes the first as the
    `default` argument there)."""
    first = [opt.default] if isinstance(opt.default, str) and opt.default.startswith("-") else []
    return (*first, *opt.param_decls)


def _cli_fields(model) -> dict[str, CliOption]:
    out = {}
    for name, info in model.model_fields.items():
        meta = [m for m in info.metadata if isinstance(m, CliOption)]
        if meta:
            out[name] = meta[0]
    return out


def test_simulation_options_are_the_schema_fields_that_declare_one():
    declared = {**_cli_fields(ClientSettings), **_cli_fields(ServerSettings)}
    assert not _cli_fields(StepTimeSettings)  # the clock's constants are set in workload files
    names = [f.name for f in dataclasses.fields(SimulateOptions)]
    assert names == ["workload", "profile", *declared]
    for name, meta in declared.items():
        opt = _option(SimulateOptions, name)
        assert _decls(opt) == ("--" + name.replace("_", "-"), *meta.aliases)
        assert opt.help == meta.help
    sim = SimulateOptions(dataset_name="image", num_prompts="4,8", profile="h200")
    assert sim.given() == {"dataset_name": "image", "num_prompts": "4,8"}
    assert set(declared) <= set(WorkloadSettings.model_fields)


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--random-range-ratio", "2"], "--random-range-ratio"),
        (["--dataset-name", "sharegpt"], "--dataset-name"),
        (["--num-prompts", "0"], "--num-prompts"),
        (["--dp-attention", "--dp-size", "0"], "--dp-size"),
        (["--chunked-prefill-size", "0"], "--chunked-prefill-size"),
        (["--model-family", "llava", "--dataset-name", "image"], "--model-family"),
    ],
)
def test_a_schema_error_names_the_option_of_its_field(args, flag):
    r = cli(["trace", "--simulate", "-q", *args])
    assert r.code == 2 and r.err.rstrip().endswith(f"({flag})"), r.err
    assert_one_line_error(r)


def test_layout_options_are_the_flag_table():
    assert [f.name for f in dataclasses.fields(LayoutOptions)] == [f.name for f in LAYOUT_FLAGS]
    for flag in LAYOUT_FLAGS:
        opt = _option(LayoutOptions, flag.name)
        assert _decls(opt) == flag.spellings and opt.help == flag.help
    # the table's defaults are SGLang's: a launch with no flag is the default layout
    assert layout_from_server_flags({}) == ParallelLayout()
    assert LAYOUT_DEFAULTS["moe_a2a_backend"] == ParallelLayout().moe_a2a_backend


def test_layout_flags_are_those_set_away_from_sglang_defaults():
    assert LayoutOptions().flags() == {}
    assert LayoutOptions(tp_size=1, dp_size=1, moe_a2a_backend="none").flags() == {}
    assert LayoutOptions(tp_size=4, dp_size=4, enable_dp_attention=True).flags() == {
        "tp_size": 4,
        "dp_size": 4,
        "enable_dp_attention": True,
    }
    assert LayoutOptions(cuda_graph_backend_prefill="full").flags() == {"cuda_graph_backend_prefill": "full"}


def test_layout_option_spellings_reach_the_command():
    r = cli(["suggest-buckets", "--tp-size", "0"])
    assert r.code == 2 and "--tp" in r.err
    r = cli(["suggest-buckets", "--two-batch-overlap", "--max-buckets", "2", "--json", "--quiet"])
    assert r.code == 0, r.err
