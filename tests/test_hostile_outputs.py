"""The attacker's suite, one door: an output path or tune's state folder that is not what it
should be. Each row is (input, expected exit, the first words of the one-line error) for the
command above it; the files every row names must be unchanged afterwards
(tests/hostile_table.py runs a row; tests/hostile_fixtures.py builds its input). 96 rows."""

from __future__ import annotations

import pytest
from hostile_table import fx, rows, run_row  # noqa: F401 (fx: the fixtures, a pytest fixture)

TORCH = ("torch",)

ROWS = [
    *rows(
        "tune {F:trace.csv} --model tiny --device cpu --state-dir {in}",
        [
            ("copy:state.garbage", 2, "invalid JSON at line 1 column 2: Expecting property"),
            ("copy:state.binary", 2, "binary data, not a tune state ({T}/copy-state.binary/state.json)"),
            ("copy:state.other_kind", 2, "not a bcgtune tune state (kind bcgtune.tune-state,"),
            ("copy:state.other_trace", 2, "this state folder holds a tune of another trace"),
            ("copy:state.deep", 2, "invalid JSON: nested too deeply ({T}/copy-state.deep/state.json)"),
            ("copy:state.oversize", 2, "larger than 64 MiB: not a tune state ({T}/copy-state.oversize/state.js"),
            ("copy:state.json_is_folder", 2, "is a folder, not a tune state ({T}/copy-state.json_is_folder/state.jso"),
            ("copy:state.file", 2, "exists and is not a folder (--state-dir {T}/copy-state.file)"),
            ("devnull:", 2, "exists and is not a folder (--state-dir /dev/null)"),
            ("longname:", 2, "cannot make the folder: File name too long ({T}/nnnnnnnnnnnnnnnnnnnnnn"),
            ("missingdir:", 2, "its parent folder does not exist (--state-dir"),
        ],
        needs=TORCH,
    ),
    *rows(
        "suggest-buckets {F:trace.csv} --write-profile {in}",
        [
            ("folder:any.empty_folder", 2, "is a folder, not a file (--write-profile {fx}/any.empty_folder)"),
            ("devnull:", 2, "is not a regular file (a device, pipe or socket):"),
            ("missingdir:", 2, "output folder does not exist (--write-profile"),
            ("longname:", 2, "cannot use as output: File name too long (--write-profile"),
            ("fifo:any.empty", 2, "is not a regular file (a device, pipe or socket):"),
            ("any.loop_link", 2, "cannot use as output: Too many levels of symbolic"),
            ("value:", 2, "empty value: give a value or leave the option"),
            ("value: ", 2, "empty value: give a value or leave the option"),
            ("file:trace.csv", 2, "is also an input of this run: refusing to overwrite"),
        ],
    ),
    *rows(
        "suggest-buckets {F:trace.csv} --plot {in}",
        [
            ("folder:any.empty_folder", 2, "is a folder, not a file (--plot {fx}/any.empty_folder)"),
            ("devnull:", 2, "is not a regular file (a device, pipe or socket):"),
            ("missingdir:", 2, "output folder does not exist (--plot {T}/no/such/folder/x)"),
            ("longname:", 2, "cannot use as output: File name too long (--plot"),
            ("fifo:any.empty", 2, "is not a regular file (a device, pipe or socket):"),
            ("any.loop_link", 2, "cannot use as output: Too many levels of symbolic"),
            ("value:", 2, "empty value: give a value or leave the option"),
            ("value: ", 2, "empty value: give a value or leave the option"),
            ("file:trace.csv", 2, "is also an input of this run: refusing to overwrite"),
        ],
    ),
    *rows(
        "trace --log {F:log.good} -o {in}",
        [
            ("folder:any.empty_folder", 2, "is a folder, not a file (-o {fx}/any.empty_folder)"),
            ("devnull:", 2, "is not a regular file (a device, pipe or socket):"),
            ("missingdir:", 2, "output folder does not exist (-o {T}/no/such/folder/x)"),
            ("longname:", 2, "cannot use as output: File name too long (-o {T}/nnnnnnnnnnnnnnnnnnnnn"),
            ("fifo:any.empty", 2, "is not a regular file (a device, pipe or socket):"),
            ("any.loop_link", 2, "cannot use as output: Too many levels of symbolic"),
            ("value:", 2, "empty value: give a value or leave the option"),
            ("value: ", 2, "empty value: give a value or leave the option"),
            ("file:log.good", 2, "is also an input of this run: refusing to overwrite"),
        ],
    ),
    *rows(
        "trace merge {F:trace.csv} {F:trace.small} -o {in}",
        [
            ("folder:any.empty_folder", 2, "is a folder, not a file (-o {fx}/any.empty_folder)"),
            ("devnull:", 2, "is not a regular file (a device, pipe or socket):"),
            ("missingdir:", 2, "output folder does not exist (-o {T}/no/such/folder/x)"),
            ("longname:", 2, "cannot use as output: File name too long (-o {T}/nnnnnnnnnnnnnnnnnnnnn"),
            ("fifo:any.empty", 2, "is not a regular file (a device, pipe or socket):"),
            ("any.loop_link", 2, "cannot use as output: Too many levels of symbolic"),
            ("value:", 2, "empty value: give a value or leave the option"),
            ("value: ", 2, "empty value: give a value or leave the option"),
            ("file:trace.csv", 2, "a merged trace is written as JSON or .npz (it"),
        ],
    ),
    *rows(
        "drift --profile {C:profile.good} --trace {F:trace.json} --write-profile {in}",
        [
            ("folder:any.empty_folder", 2, "is a folder, not a file (--write-profile {fx}/any.empty_folder)"),
            ("devnull:", 2, "is not a regular file (a device, pipe or socket):"),
            ("missingdir:", 2, "output folder does not exist (--write-profile"),
            ("longname:", 2, "cannot use as output: File name too long (--write-profile"),
            ("fifo:any.empty", 2, "is not a regular file (a device, pipe or socket):"),
            ("any.loop_link", 2, "cannot use as output: Too many levels of symbolic"),
            ("value:", 2, "empty value: give a value or leave the option"),
            ("value: ", 2, "empty value: give a value or leave the option"),
        ],
    ),
    *rows(
        "trace --simulate --num-prompts 4 -o {in}",
        [
            ("folder:any.empty_folder", 2, "is a folder, not a file (-o {fx}/any.empty_folder)"),
            ("devnull:", 2, "is not a regular file (a device, pipe or socket):"),
            ("missingdir:", 2, "output folder does not exist (-o {T}/no/such/folder/x)"),
            ("longname:", 2, "cannot use as output: File name too long (-o {T}/nnnnnnnnnnnnnnnnnnnnn"),
            ("fifo:any.empty", 2, "is not a regular file (a device, pipe or socket):"),
            ("any.loop_link", 2, "cannot use as output: Too many levels of symbolic"),
            ("value:", 2, "empty value: give a value or leave the option"),
            ("value: ", 2, "empty value: give a value or leave the option"),
        ],
    ),
    *rows(
        "calibrate --sizes 16 --model tiny --device cpu -o {in}",
        [
            ("folder:any.empty_folder", 2, "is a folder, not a file (-o {fx}/any.empty_folder)"),
            ("devnull:", 2, "is not a regular file (a device, pipe or socket):"),
            ("missingdir:", 2, "output folder does not exist (-o {T}/no/such/folder/x)"),
            ("longname:", 2, "cannot use as output: File name too long (-o {T}/nnnnnnnnnnnnnnnnnnnnn"),
            ("fifo:any.empty", 2, "is not a regular file (a device, pipe or socket):"),
            ("any.loop_link", 2, "cannot use as output: Too many levels of symbolic"),
            ("value:", 2, "empty value: give a value or leave the option"),
            ("value: ", 2, "empty value: give a value or leave the option"),
        ],
        needs=TORCH,
    ),
    *rows(
        "validate --buckets 16 --model tiny --device cpu -o {in}",
        [
            ("folder:any.empty_folder", 2, "is a folder, not a file (-o {fx}/any.empty_folder)"),
            ("devnull:", 2, "is not a regular file (a device, pipe or socket):"),
            ("missingdir:", 2, "output folder does not exist (-o {T}/no/such/folder/x)"),
            ("longname:", 2, "cannot use as output: File name too long (-o {T}/nnnnnnnnnnnnnnnnnnnnn"),
            ("fifo:any.empty", 2, "is not a regular file (a device, pipe or socket):"),
            ("any.loop_link", 2, "cannot use as output: Too many levels of symbolic"),
            ("value:", 2, "empty value: give a value or leave the option"),
            ("value: ", 2, "empty value: give a value or leave the option"),
        ],
        needs=TORCH,
    ),
    *rows(
        "capture --buckets 16 --model tiny --device cpu -o {in}",
        [
            ("folder:any.empty_folder", 2, "is a folder, not a file (-o {fx}/any.empty_folder)"),
            ("devnull:", 2, "is not a regular file (a device, pipe or socket):"),
            ("missingdir:", 2, "output folder does not exist (-o {T}/no/such/folder/x)"),
            ("longname:", 2, "cannot use as output: File name too long (-o {T}/nnnnnnnnnnnnnnnnnnnnn"),
            ("fifo:any.empty", 2, "is not a regular file (a device, pipe or socket):"),
            ("any.loop_link", 2, "cannot use as output: Too many levels of symbolic"),
            ("value:", 2, "empty value: give a value or leave the option"),
            ("value: ", 2, "empty value: give a value or leave the option"),
        ],
        needs=TORCH,
    ),
    *rows(
        "tune {F:trace.csv} --model tiny --device cpu --state-dir {T}/state --write-profile {in}",
        [
            ("folder:any.empty_folder", 2, "is a folder, not a file (--write-profile {fx}/any.empty_folder)"),
            ("devnull:", 2, "is not a regular file (a device, pipe or socket):"),
            ("missingdir:", 2, "output folder does not exist (--write-profile"),
            ("longname:", 2, "cannot use as output: File name too long (--write-profile"),
            ("fifo:any.empty", 2, "is not a regular file (a device, pipe or socket):"),
            ("any.loop_link", 2, "cannot use as output: Too many levels of symbolic"),
            ("value:", 2, "empty value: give a value or leave the option"),
            ("value: ", 2, "empty value: give a value or leave the option"),
            ("file:trace.csv", 2, "is also an input of this run: refusing to overwrite"),
        ],
        needs=TORCH,
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[f"{n}-{r.id}" for n, r in enumerate(ROWS)])
def test_row(row, fx, tmp_path):  # noqa: F811
    run_row(row, fx, tmp_path)
