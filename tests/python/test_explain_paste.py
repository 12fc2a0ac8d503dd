"""explain reads text as people paste it (issue 27): each rule of the normaliser alone, the rules stacked, messages
joined across every kind of break, and numbers taken only when whole: read across a break the text cannot settle,
a number is said to be unreadable, never guessed. The issue's own examples, verbatim."""

from __future__ import annotations

import json

import pytest

from gpuguard import _core
from gpuguard.logs import explain
from gpuguard.logs import paste_rules as rules
from gpuguard.logs.lines import read_prefixes
from gpuguard.logs.normalise import normalise
from gpuguard.logs.registry import FILTER_GROUPS, FILTER_KEYWORDS, LINE_END_GROUPS, LINE_END_HEADS

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)


def one(found, kind):
    matching = [d for d in found if d.kind == kind]
    assert len(matching) == 1, [d.kind for d in found]
    return matching[0]


# NCCL <= 2.29, src/init.cc: WARN("Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx", ...);
# 1000 is bus id 0000:01:00.0 (busIdToInt64 drops ':' and '.').
DUPLICATE = "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000"
# torch's device-mismatch text (aten/src/ATen/core/op_registration/adaption.cpp, up to torch 2.5)
MISMATCH = ("RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:1 and "
            "cuda:0! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)")


# ---- the issue's examples, verbatim ----------------------------------------------------------------------------

def test_issue_a_device_mismatch_quoted_and_wrapped_after_cuda1_and():
    text = ("> RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:1 and\n"
            "> cuda:0! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)\n")
    d = one(explain(text, match_local=False), "device_mismatch")
    assert d.devices == ("cuda:1", "cuda:0")
    assert "cuda:1 and cuda:0 (argument mat1 of wrapper_CUDA_addmm)" in d.summary and not d.unreadable


def test_issue_invalid_device_ordinal_wrapped_at_the_space():
    d = one(explain("RuntimeError: CUDA error: invalid device\nordinal\n", match_local=False),
            "invalid_device_ordinal")
    assert "GLOBAL rank where the LOCAL rank belongs" in d.cause


def test_issue_duplicate_gpu_from_a_viewer_that_numbers_lines_gives_device_1000_never_13():
    text = "   12 | Duplicate GPU detected : rank 1 and rank 0 both on CUDA device\n   13 | 1000\n"
    d = one(explain(text, match_local=False), "duplicate_gpu")
    assert d.ranks == (0, 1)
    assert d.devices == ("0000:01:00.0 (NCCL's 'CUDA device 1000')",)
    assert "0000:00:01.3" not in d.summary + " ".join(d.devices) and "'CUDA device 13" not in " ".join(d.devices)


def test_issue_a_container_runtimes_prefix():
    # CRI log file line as `kubectl logs` of the pod's file shows it: "<RFC3339Nano> stderr F <line>"
    text = f"2026-01-05T10:00:00.123456789Z stderr F [rank3]: {DUPLICATE.replace('rank 1 and rank 0', 'rank 3 and rank 2')}\n"
    d = one(explain(text, match_local=False), "duplicate_gpu")
    assert d.ranks == (2, 3) and "0000:01:00.0" in d.summary


def test_issue_quot_escaped_quotes():
    # gpuguard.watch()'s stall line on a web page that escaped its quotes
    stall = '{"gpuguard_stall": {"kind": "rank_behind", "op": "ALL_REDUCE", "seq": 7, "stuck_ranks": [2]}}'
    d = one(explain(stall.replace('"', "&quot;"), match_local=False), "gpuguard_stall")
    assert d.ranks == (2,) and d.summary.startswith("Rank 2 never entered ALL_REDUCE #7")


def test_issue_a_fenced_code_block():
    d = one(explain(f"```\n[rank1]: {DUPLICATE}\n```\n", match_local=False), "duplicate_gpu")
    assert d.ranks == (0, 1) and "0000:01:00.0" in d.summary


def test_issue_wrapping_in_the_middle_of_a_word_or_with_indentation():
    at = MISMATCH.index("same") + 2
    mid_word = explain(f"{MISMATCH[:at]}\n{MISMATCH[at:]}\n", match_local=False)  # "... the sa" / "me device"
    assert one(mid_word, "device_mismatch").devices == ("cuda:1", "cuda:0")
    at = MISMATCH.index(" cuda:0")
    indented = explain(f"{MISMATCH[:at]}\n    {MISMATCH[at + 1:]}\n", match_local=False)  # "... and" / "    cuda:0!"
    assert one(indented, "device_mismatch").devices == ("cuda:1", "cuda:0")


# ---- each rule alone ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("\x1b[36m(RayWorker pid=1)\x1b[0m x", "(RayWorker pid=1) x"),
    ("\x1b]0;title\x07text", "text"),          # an operating-system command (a terminal's title)
    ("plain", "plain"),
])
def test_ansi_codes(text, expected):
    assert rules.ansi_codes(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("[36m(RayTrainWorker pid=2231)[0m RuntimeError", "(RayTrainWorker pid=2231) RuntimeError"),
    ("[1;31mERROR[0m", "ERROR"),
    ("waited [5m] for it", "waited [5m] for it"),   # a bracketed duration is text
])
def test_bare_colour_codes(text, expected):
    assert rules.bare_colour_codes(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("{&quot;gpuguard_stall&quot;: 1}", '{"gpuguard_stall": 1}'),
    ("&#34;a&#x22; &gt; b &lt; c &amp; d&nbsp;e", '"a" > b < c & d e'),
    ("{&amp;quot;log&amp;quot;: 1}", '{"log": 1}'),   # escaped twice
    ("a & b; c", "a & b; c"),                          # a bare ampersand is text
])
def test_html_entities(text, expected):
    assert rules.html_entities(text) == expected


@pytest.mark.parametrize("text, end", [
    ("> x", 2), ("> > x", 4), (">> x", 3), (">>> x", 4), ("   > x", 5), ("x > y", None), ("-> x", None)])
def test_quote_markers_nested(text, end):
    assert rules.quote_markers(text) == end


@pytest.mark.parametrize("text, fence", [
    ("```", True), ("```text", True), ("  ```python", True), ("~~~", True), ("`code`", False), ("x ```", False)])
def test_code_fence(text, fence):
    assert rules.code_fence(text) is fence


@pytest.mark.parametrize("text, end", [
    ("   12 | text", 8),        # a viewer's gutter
    ("12│text", 3),             # a gutter without blanks
    ("  12 │ text", 7),         # bat
    ("     1\ttext", 7),        # `cat -n`, `nl`
    ("       ", 7),             # `nl`'s unnumbered empty line
    ("  6 ranks have launched up to operation 6649", None),   # NCCL RAS's own count, not a line number
    ("12:34:56 started", None),                               # a time
])
def test_line_numbers_of_viewers_cat_n_and_nl(text, end):
    assert rules.line_numbers(text) == end


def test_docker_json_log_lines_whole_cut_partial_and_escaped():
    line = "[rank1]: <x> & " + DUPLICATE
    record = json.dumps({"log": line + "\n", "stream": "stderr", "time": "2026-01-05T10:00:00Z"})
    record = record.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")  # Go's encoder
    t = rules.docker_json(record)
    assert (t.replaced, t.stream, t.partial, t.ended) == (line, "stderr", False, True)
    cut = rules.docker_json(record[:60])                      # cut by the reader: read as far as it goes
    assert cut.replaced == line[:len(cut.replaced)] and cut.open_string
    partial = rules.docker_json(json.dumps({"log": "a" * 10, "stream": "stdout"}))   # Docker split a long line
    assert partial.partial and partial.stream == "stdout"
    assert rules.docker_json('{"msg": "x"}') is None
    assert rules.json_string_rest('device 1000\\n", "stream": "stderr"}') == ("device 1000", False)


@pytest.mark.parametrize("text, stream, partial", [
    ("2026-01-05T10:00:00.123456789Z stderr F [rank3]: x", "stderr", False),
    ("2026-01-05T10:00:00.123456789+00:00 stdout P part of a long", "stdout", True),
])
def test_cri_prefix_full_and_partial(text, stream, partial):
    t = rules.cri_prefix(text)
    assert (t.stream, t.partial) == (stream, partial) and text[t.end:].startswith(("[rank3]", "part"))


def test_kubectl_timestamps_and_syslog():
    assert rules.kubectl_timestamp("2026-01-05T10:00:00.123456789Z [rank1]: x").end == 31
    assert rules.kubectl_timestamp("2026-01-05T10:00:00Z ERROR boom") is None   # a level: the program's header
    t = rules.syslog_prefix("Nov 24 10:00:00 node7 python[1234]: [rank1]: x")
    assert t.stream == "python" and t.end == 36


@pytest.mark.parametrize("text, message", [
    ("2024-10-09 21:16:03,123 - torch.distributed - ERROR - boom", "boom"),           # Python logging's asctime
    ("[2024-10-09 21:16:03,123] torch.distributed.elastic.api: [ERROR] boom", "boom"),  # torch.distributed.elastic
    ("2025-01-01 10:00:00,123 INFO worker.py:1234 -- boom", "boom"),                  # Ray
    ("[2026-01-05 10:00:00] boom", "boom"),                                           # a bracketed timestamp
    ("2026-01-05T10:00:00Z ERROR boom", "boom"),                                      # ISO 8601 with a level
    ("I1124 10:00:00.000000 123 file.cc:42] boom", "boom"),                           # glog
    ("[E1121 05:00:00.123456 ProcessGroupNCCL.cpp:683] boom", "boom"),                # c10 logging
    ("ERROR:torch.distributed:boom", "boom"),                                         # logging.basicConfig
])
def test_log_headers_of_iso8601_glog_and_python_logging(text, message):
    end = rules.log_header(text)
    assert end is not None and text[end:] == message


def test_launcher_prefixes_and_log_headers_stack_in_any_order():
    body, origin, header = read_prefixes("[rank1]:[E1121 05:00:00.123456 ProcessGroupNCCL.cpp:683] [Rank 1] boom")
    assert (body, origin.rank, header) == ("[Rank 1] boom", 1, True)
    body, origin, header = read_prefixes("2026-01-05 10:00:00,123 INFO [default3]:boom")
    assert (body, origin.local_rank, header) == ("boom", 3, True)


def test_the_normaliser_stacks_the_rules_from_the_outside_in():
    raw = "&gt; &gt;    12 | 2026-01-05T10:00:00.123456789Z stderr F [rank3]:[E1121 05:00:00 x.cc:1] boom\r\n"
    line = normalise(raw)
    assert line.body == "boom" and line.origin.rank == 3 and line.header
    assert line.rules == ("html_entities", "quote_markers", "line_numbers", "cri_prefix")
    assert normalise("> ```text").fence and normalise("    12 | ```").fence


# ---- joining a message broken across lines ----------------------------------------------------------------------

def test_a_message_wrapped_at_a_space_is_joined_plainly_indented_or_keeping_the_space():
    head, tail = DUPLICATE[:47], DUPLICATE[48:]   # "... rank 0 both on" / "CUDA device 1000"
    for text in (f"{head}\n{tail}\n", f"{head}\n    {tail}\n", f"{head} \n{tail}\n"):
        d = one(explain(text, match_local=False), "duplicate_gpu")
        assert (d.ranks, d.devices, d.unreadable) == ((0, 1), ("0000:01:00.0 (NCCL's 'CUDA device 1000')",), ())


def test_a_message_wrapped_inside_a_word_is_joined_as_it_was():
    line = "[rank1]:[E1121 05:00:00 ProcessGroupNCCL.cpp:683] Last error: " + DUPLICATE
    for at in (line.index("GPU") + 1, line.index("detected") + 3):   # "Duplicate G|PU", "det|ected": a keyword cut
        d = one(explain(f"{line[:at]}\n{line[at:]}\n", match_local=False), "duplicate_gpu")
        assert d.ranks == (0, 1) and "0000:01:00.0" in d.summary and not d.unreadable, at


def test_a_cri_line_the_runtime_split_is_joined_exactly_even_between_another_streams_records():
    ts = "2026-01-05T10:00:00.123456789Z"
    text = (f"{ts} stderr P [rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 10\n"
            f"{ts} stdout F step 12 loss 0.1\n"
            f"{ts} stderr F 00\n")
    d = one(explain(text, match_local=False), "duplicate_gpu")
    assert d.devices == ("0000:01:00.0 (NCCL's 'CUDA device 1000')",) and not d.unreadable


def test_a_docker_record_a_terminal_broke_is_read_to_its_closing_quote():
    record = json.dumps({"log": f"[rank1]: {DUPLICATE}\n", "stream": "stderr", "time": "2026-01-05T10:00:00Z"})
    at = record.index("device 1000") + len("device ")
    d = one(explain(record[:at] + "\n" + record[at:] + "\n", match_local=False), "duplicate_gpu")
    # the break fell before the number: read whole (it begins the rest of the string)
    assert d.devices == ("0000:01:00.0 (NCCL's 'CUDA device 1000')",)


# ---- numbers are taken only when whole ----------------------------------------------------------------------------

NCCL_LINE = ("node7:2811:2811 [3] init.cc:1027 NCCL WARN Duplicate GPU detected : rank 7 and rank 5 both on CUDA "
             "device 1a000")


def test_a_number_a_break_cuts_where_the_text_does_not_tell_how_is_unreadable_with_cause_and_fix():
    text = NCCL_LINE[:-4] + "\n" + NCCL_LINE[-4:] + "\n"   # "... device 1" / "a000": a terminal, or two words?
    d = one(explain(text, match_local=False), "duplicate_gpu")
    assert d.ranks == (5, 7)
    assert d.unreadable == ("the CUDA device (PCI bus id) NCCL named",)
    assert "a GPU whose PCI bus id is unreadable" in d.summary and "Unreadable in this text" in d.summary
    assert "0000:00:00.1" not in d.summary + " ".join(d.devices)
    assert d.cause.startswith("NCCL found two ranks") and "set_device(local_rank)" in d.fix


def test_a_number_cut_by_a_terminal_whose_width_the_paste_shows_is_read_whole():
    # an 80-column terminal broke two lines: the first shows the width, so the cut in "1a|000" is the terminal's
    first = "[rank1]: RuntimeError: NCCL communicator was aborted on rank 1 while it waited for a collective operation"
    message = "Duplicate GPU detected : rank 7 and rank 5 both on CUDA device 1a000"
    second = "[rank7]:".ljust(80 - 2 - message.index("1a000")) + message
    assert second[:80].endswith("device 1a")
    text = "\n".join([first[:80], first[80:], second[:80], second[80:]]) + "\n"
    d = one(explain(text, match_local=False), "duplicate_gpu")
    assert d.devices == ("0000:1a:00.0 (NCCL's 'CUDA device 1a000')",) and not d.unreadable
    # without the first line nothing shows the terminal's width: the same cut is unreadable
    d = one(explain("\n".join([second[:80], second[80:]]) + "\n", match_local=False), "duplicate_gpu")
    assert d.unreadable and "0000:00:00.1" not in " ".join(d.devices) + d.summary


@pytest.mark.parametrize("after, device", [
    ("dist.barrier()", "0000:01:00.0"),   # glued, the number would run into a word: not a reading of it
    ("Traceback (most recent call last):", "0000:01:00.0"),   # a record of its own
    ("a rank died", None),                # "1000a" or "1000": the text cannot tell
])
def test_a_number_at_a_lines_end_is_whole_when_the_next_line_cannot_go_on_with_it(after, device):
    d = one(explain(f"{DUPLICATE}\n{after}\n", match_local=False), "duplicate_gpu")
    if device:
        assert device in d.summary and not d.unreadable
    else:
        assert d.unreadable and "0000:01:00.0" not in d.summary and "0000:10:00.0" not in d.summary


def test_a_line_number_prefix_never_becomes_part_of_a_number():
    for gutter in ("{n:>5} | ", "{n:>6}\t", "{n:>4} │ "):
        text = "".join(gutter.format(n=n) + line + "\n"
                       for n, line in ((12, DUPLICATE[:-5]), (13, DUPLICATE[-4:])))
        d = one(explain(text, match_local=False), "duplicate_gpu")
        assert d.devices == ("0000:01:00.0 (NCCL's 'CUDA device 1000')",), gutter


def test_a_prefix_a_break_cuts_leaves_who_printed_it_unreadable_not_wrong():
    line = "[rank7]:[E1121 05:00:00 ProcessGroupNCCL.cpp:683] " + NCCL_LINE
    at = line.index("init.c") + 6   # "... [3] init.c" / "c:1027 NCCL WARN ...": a terminal's cut, or a line of its own?
    d = one(explain(f"{line[:at]}\n{line[at:]}\n", match_local=False), "duplicate_gpu")
    assert "0000:1a:00.0" in d.summary and d.ranks == (5, 7)
    assert "who printed it (its prefix is broken across lines)" in d.unreadable and "on host" not in d.summary


# ---- the keyword filter ---------------------------------------------------------------------------------------------

def test_the_reader_finds_a_keyword_a_break_cut_by_its_pieces_and_by_a_head_at_a_lines_end():
    scanner = _core.Scanner(list(FILTER_KEYWORDS), 16384, 0, 1024, list(FILTER_GROUPS), 1, list(LINE_END_HEADS),
                            list(LINE_END_GROUPS))
    lines = ["node7 ok", "RuntimeError: CUDA error: invalid device", "ordinal",  # a fragment of 22 bytes on line 2
             "{\"gpugu", "ard_stall\": {}}",                                     # a short keyword's head at the end
             "all good"]
    out = scanner.feed(("\n".join(lines) + "\n").encode()) + scanner.finish()
    hits = [(n, text.decode()) for n, hit, text, _ in out if hit]
    assert hits == [(2, lines[1]), (4, lines[3])]
    assert [n for n, hit, _, _ in out if not hit] == [3, 5]   # the line after each hit


# gpuguard's own report (csrc/gpuguard/tensor_devices.cc): its cause and fix are quoted from the log, so a paste's
# break in them is read like one in a number
REPORT = ("[rank3]: gpuguard.errors.DeviceMismatchError: gpuguard: layer 'blocks.2' (Linear) is about to run on "
          "tensors from 2 devices (cuda:1, cuda:0); PyTorch would stop inside this layer with \"Expected all tensors "
          "to be on the same device\".\n"
          "[rank3]:   cuda:1: 2 parameters of 'blocks.2': weight, bias\n"
          "[rank3]: Likely cause: its input was produced on cuda:0 (by the layers before it).\n"
          "[rank3]: Fix: keep the layer with the layers before it: model.blocks[2].to(\"cuda:0\").\n")


def test_the_reports_cause_and_fix_a_terminal_broke_are_read_whole():
    clean = one(explain(REPORT, match_local=False), "gpuguard_device_mismatch")
    width = 80
    broken = "".join(line[i:i + width] + "\n" for line in REPORT.splitlines() for i in range(0, len(line), width))
    found = one(explain(broken, match_local=False), "gpuguard_device_mismatch")
    assert found.cause == clean.cause == "Likely cause: its input was produced on cuda:0 (by the layers before it)."
    assert found.fix == clean.fix
    assert (found.devices, found.ranks, found.unreadable) == (("cuda:1", "cuda:0"), (3,), ())


def test_a_reports_cause_a_break_at_a_space_leaves_unsure_is_unreadable_not_cut():
    # "produced" / "on cuda:0": a break at a space, or inside a word ("producedon"); both read as a finished line
    text = REPORT.replace("its input was produced on", "its input was produced\non")
    found = one(explain(text, match_local=False), "gpuguard_device_mismatch")
    assert found.unreadable == ("the report's cause and fix (broken across lines)",)
    assert "produced" not in found.cause and found.fix.startswith("Fix: ")
    assert found.devices == ("cuda:1", "cuda:0")
