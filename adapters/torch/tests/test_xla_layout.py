"""fsdpcheck_torch.xla_layout on fixtures cut from a real XLA:CPU run (tests/data/hlo/README.md): FSDPv2's
sharding strings, the findings on a parameter marked along the wrong dimension, the HLO collectives (tuple-
shaped and async ones too) and the per-unit byte table against the reference's comm log. Needs no torch."""

import json
import os
import shutil

import pytest

from fsdpcheck_torch import xla_layout as X

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hlo")
RUN = os.path.join(DATA, "gpt2_w4")
HLO, TRACE, LOG = os.path.join(RUN, "hlo"), os.path.join(RUN, "trace"), os.path.join(RUN, "commlog.jsonl")
GRAPH = "module_0001.SyncTensorsGraph.1257.cpu_after_optimizations.txt"


def _specs():
    """The read-back rows of specs.json."""
    with open(os.path.join(DATA, "specs.json")) as f:
        return json.load(f)


def _trace():
    """The fixture's trace.json and shapes."""
    return X.load_trace(TRACE)


@pytest.mark.parametrize("row", _specs(), ids=str)
def test_spec_is_xla_readback(row):
    """The rule's string is what torch_xla read back on (4, 1), (2, 2), (1, 4) and a (2, 2) with swapped axes."""
    assert X.fsdpv2_spec(row["shape"], row["mesh_shape"], row["axes"]) == row["spec"]


def test_spec_strings_by_hand():
    """The two meshes of the issue, written out: (4, 1) tiles the largest dim; (2, 2) adds the replicated tile."""
    assert X.fsdpv2_spec([16, 48], (4, 1), ("fsdp", "model")) == "{devices=[1,4]0,1,2,3}"
    assert X.fsdpv2_spec([97, 16], (2, 2), ("fsdp", "model")) == "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"
    assert X.fsdpv2_spec([], (2, 2), ("fsdp", "model")) == "{replicated}"
    assert X.fsdpv2_dim([16, 16]) == 0 and X.fsdpv2_dim([2, 3]) == 1 and X.fsdpv2_dim([]) is None


def test_parse_spec_forms():
    """Explicit devices, iota devices, replicated, and a form it does not read."""
    assert X.parse_spec("{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}")["replicate_last"]
    assert X.parse_spec("{devices=[4,1]<=[4]}")["devices"] == "<=[4]"
    assert X.parse_spec("{replicated}")["tiles"] is None
    assert X.parse_spec("{maximal device=0}") is None
    assert X.sharded_dims("{devices=[1,4]0,1,2,3}", 2) == [1]


def test_sharding_findings_clean():
    """The real run's read-backs all follow the rule."""
    tj, shapes = _trace()
    assert X.sharding_findings(tj["torch"], shapes) == []


def test_sharding_findings_wrong_dim():
    """A parameter re-marked along dim 0 (the rule says its largest, dim 1) is named with both dims."""
    tj, shapes = _trace()
    name = "transformer.h.1.attn.c_attn.weight"
    tj["torch"]["sharding"][name] = "{devices=[4,1]0,1,2,3}"
    found = X.sharding_findings(tj["torch"], shapes)
    assert len(found) == 1
    assert name in found[0] and "sharded along dim 0" in found[0] and "shards dim 1" in found[0]


def test_sharding_findings_replicated_and_device_order():
    """A replicated parameter, and one on the rule's dim with other devices, are each a finding."""
    tj, shapes = _trace()
    tj["torch"]["sharding"]["transformer.wpe.weight"] = "{replicated}"
    tj["torch"]["sharding"]["transformer.wte.weight"] = "{devices=[4,1]3,2,1,0}"
    found = X.sharding_findings(tj["torch"], shapes)
    assert any("wpe" in f and "no dim (replicated)" in f for f in found)
    assert any("wte" in f and "other devices" in f for f in found)
    assert X.sharding_findings({}, shapes)[0].startswith("the trace's info has no mesh")


def test_collectives_of_the_real_graph():
    """The forward+backward graph's collectives, as counted in the full dump; the read-back module's one."""
    cs = X.collectives(HLO)
    ops = [c["op"] for c in cs[GRAPH]]
    counts = {op: ops.count(op) for op in set(ops)}
    assert counts == {"all-gather": 34, "all-reduce": 22, "all-to-all": 22, "collective-permute": 14}
    assert "reduce-scatter" not in counts
    (rb,) = cs["module_0023.ReplicateShardedData.6.cpu_after_optimizations.txt"]
    assert (rb["result"], rb["operands"], rb["bytes"]) == ([[100, 16]], [[25, 16]], 6400)


def test_param_all_gather_record():
    """wte's gather: shard [25, 16] to its padded [100, 16] along dim 0 over the four devices."""
    first = X.collectives(HLO)[GRAPH][0]
    assert first["op"] == "all-gather" and first["dtype"] == "f32"
    assert first["result"] == [[100, 16]] and first["operands"] == [[25, 16]] and first["dimensions"] == [0]
    assert first["replica_groups"] == [[0, 1, 2, 3]] and first["result_elements"] == 1600
    assert first["bytes"] == 6400 and not first["combined"]


def test_tuple_all_to_all_real_line():
    """A real combined all-to-all: four pieces in, four out, its bytes the pieces' sum."""
    line = (
        "  %all-to-all.35 = (f32[2,16,1,12]{3,2,1,0}, f32[2,16,1,12]{3,2,1,0}, f32[2,16,1,12]{3,2,1,0}, "
        "f32[2,16,1,12]{3,2,1,0}) all-to-all(%a, %b, %c, %d), channel_id=64, replica_groups={{0,1,2,3}}"
    )
    text = "ENTRY %m (p: f32[]) -> f32[] {\n" + "".join(
        f"  %{n} = f32[2,16,1,12]{{3,2,1,0}} parameter({i})\n" for i, n in enumerate("abcd")
    )
    (c,) = X.module_collectives(text + line + "\n}\n")
    assert c["combined"] and len(c["result"]) == 4 and c["operands"] == [[2, 16, 1, 12]] * 4
    assert c["operand_bytes"] == 4 * 384 * 4 == c["bytes"]


def test_async_combined_collectives_counted_once():
    """XLA's async form (GPU dumps): a combined all-gather-start/-done pair is one collective, its result
    the -done's tuple; an all-reduce-start with inline operand shapes reads them."""
    text = """ENTRY %m (p0: f32[4,8], p1: f32[2]) -> (f32[16,8], f32[8]) {
  %p0 = f32[4,8]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %p1 = f32[2]{0} parameter(1), sharding={devices=[4]<=[4]}
  %ags = ((f32[4,8]{1,0}, f32[2]{0}), (f32[16,8]{1,0}, f32[8]{0})) all-gather-start(%p0, %p1), replica_groups=[1,4]<=[4], dimensions={0}
  %agd = (f32[16,8]{1,0}, f32[8]{0}) all-gather-done(%ags)
  %ars = f32[8]{0} all-reduce-start(f32[8]{0} %x), replica_groups=[2,2]<=[2,2]T(1,0), to_apply=%add
  %ard = f32[8]{0} all-reduce-done(f32[8]{0} %ars)
  ROOT %t = (f32[16,8]{1,0}, f32[8]{0}) tuple(%agd, %ard)
}
"""
    ag, ar = X.module_collectives(text)
    assert ag["op"] == "all-gather" and ag["async"] and ag["combined"]
    assert ag["result"] == [[16, 8], [8]] and ag["operands"] == [[4, 8], [2]] and ag["bytes"] == (128 + 8) * 4
    assert ag["replica_groups"] == [[0, 1, 2, 3]]
    assert ar["op"] == "all-reduce" and ar["operands"] == [[8]] and ar["replica_groups"] == [[0, 2], [1, 3]]


def test_theory_from_commlog():
    """Rank 0's first step: each unit's gathers and reduce-scatter; the root not gathered in backward."""
    units, other = X.theory(LOG)
    assert units[0] == {"forward_gather": 8576, "backward_gather": 0, "grad_reduce": 8576}
    assert units[1] == units[2] == {"forward_gather": 13120, "backward_gather": 13120, "grad_reduce": 13120}
    assert other == {"all_reduce": 88}


def test_report_byte_table():
    """The per-unit table: wte's gather and padding match the theory; the blocks gather only c_proj and
    four of the fourteen [16] vectors; gradients reduced by all-reduce."""
    d = X.report(HLO, TRACE, LOG)
    root, h0, h1 = d["units"]
    assert root["theory"]["forward_gather"] == 8576 and root["hlo"]["forward_gather"] == pytest.approx(6400 + 512 / 14)
    assert root["padding"] == {"theory": 192, "xla": 192}
    assert h0["hlo"]["forward_gather"] == pytest.approx(1024 + 6 * 256 / 14) == h1["hlo"]["forward_gather"]
    assert h0["approx"]["forward_gather"] and not h0["hlo"]["backward_gather"]
    assert sum(u["hlo"]["forward_gather"] for u in d["units"]) == pytest.approx(6400 + 2 * 1024 + 4 * 64)
    assert sum(u["hlo"]["grad_reduce"] for u in d["units"]) == pytest.approx(6208 + 2 * 1024 + 4 * 64)
    assert d["grad_ops"] == ["all-reduce"] and d["sharding_findings"] == []
    wte = next(c for c in d["classes"] if c["shape"] == [97, 16])
    assert wte["padded"] == [100, 16] and wte["gathered_once"] == 1 and wte["grad_reductions"] == 1
    assert d["other"]["all-to-all"] == {"count": 22, "bytes": 53248, "combined": 22, "scalar": 0}
    assert d["other"]["all-reduce"]["scalar"] == 3
    assert d["readback"] == {"modules": 1, "collectives": 1, "bytes": 6400}


def test_report_lines_and_mutant(tmp_path):
    """The printed report has the table and the notes; a re-marked parameter shows up in it."""
    trace = tmp_path / "trace"
    shutil.copytree(TRACE, trace)
    tj = json.loads((trace / "trace.json").read_text())
    tj["torch"]["sharding"]["transformer.h.0.mlp.c_fc.weight"] = "{devices=[4,1]0,1,2,3}"
    (trace / "trace.json").write_text(json.dumps(tj))
    lines = X.format_report(X.report(HLO, str(trace), LOG))
    text = "\n".join(lines)
    assert "forward gather" in text and "gradients are reduced by all-reduce" in text
    assert "sharding: transformer.h.0.mlp.c_fc.weight [16, 64]: sharded along dim 0" in text


def test_cli(capsys, tmp_path):
    """Prints the report (exit 0); one line and exit 2 on a missing path, a bad comm log or bad usage."""
    assert X.main([HLO, TRACE, LOG]) == 0
    assert "grad reduce" in capsys.readouterr().out
    assert X.main([str(tmp_path / "nope"), TRACE, LOG]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    bad = tmp_path / "log.jsonl"
    bad.write_text("{not json\n")
    assert X.main([HLO, TRACE, str(bad)]) == 2
    assert X.main([HLO, str(tmp_path), LOG]) == 2
    assert X.main([str(tmp_path), TRACE, LOG]) == 2
    assert X.main([HLO]) == 2
