"""The user's own inputs (issue 32 item 4): request traces by path (``--trace-file``), models from a Hugging Face
config.json (``--model-config``), hardware from a TOML file (``--hardware``) and ``--set section.field=value``.

Each named trace error, each bad value's message (with its allowed range) and the command line's handling of them
(exit 2, one line naming the flag, nothing written, no work started); good CSV and JSONL traces run end to end on
a few requests; a config.json of a known model gives the built-in configuration; a TOML value and a --set reach
the calibrated models (the run's NDP geometry, the L3 ranksets and GPU model)."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from host import cli
from host.models import get_model
from host.models.hardware_file import FIELDS, load_hardware, parse_set, SECTIONS
from host.models.hf import load_hf_config
from host.workloads import TRACE_ERRORS, TraceFileError, load_trace_file

GOOD_CSV = "arrival_s,prompt_tokens,output_tokens,adapter_id,rank\n0.0,100,20,3,16\n0.5,200,10,7,8\n" \
           "0.5,50,30,3,16\n2.0,80,15,1,64\n"
GOOD_JSONL = ('{"arrival_s": 1.0, "prompt_tokens": 100, "output_tokens": 20}\n'
              '{"arrival_s": 1.25, "prompt_tokens": 300, "output_tokens": 12}\n\n'
              '{"arrival_s": 2.0, "prompt_tokens": 64, "output_tokens": 8, "note": "x"}\n')

# the Hugging Face config.json files of three models the project has built in (fields as published)
LLAMA2_7B_HF = {"_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"],
                "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
                "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
                "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
                "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
                "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.31.0.dev0",
                "use_cache": True, "vocab_size": 32000}
QWEN3_30B_A3B_HF = {"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "bos_token_id": 151643,
                    "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
                    "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
                    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
                    "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32,
                    "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
                    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 151936}
OPT_66B_HF = {"_name_or_path": "facebook/opt-66b", "activation_function": "relu", "architectures": ["OPTForCausalLM"],
              "do_layer_norm_before": True, "ffn_dim": 36864, "hidden_size": 9216, "max_position_embeddings": 2048,
              "model_type": "opt", "num_attention_heads": 72, "num_hidden_layers": 64, "torch_dtype": "float16",
              "vocab_size": 50272, "word_embed_proj_dim": 9216}


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text if isinstance(text, str) else json.dumps(text))
    return str(p)


# --- the trace loader -----------------------------------------------------------------------------------------------

# name -> (file name, content, error kind, what the message says)
BAD_TRACES = {
    "missing-column": ("a.csv", "arrival_s,prompt_tokens\n0,10\n", "missing-column",
                       "missing column(s) ['output_tokens']"),
    "missing-column-jsonl": ("a.jsonl", '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 3}\n'
                                        '{"arrival_s": 1, "prompt_tokens": 5}\n', "missing-column", "line 2: no output_tokens"),
    "rank-without-adapter": ("a.csv", "arrival_s,prompt_tokens,output_tokens,rank\n0,1,1,8\n", "missing-column",
                             "rank needs column adapter_id"),
    "non-positive": ("a.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,0,5\n", "non-positive",
                     "line 3, column prompt_tokens: 0 is not positive; allowed: an integer >= 1"),
    "negative-output": ("a.jsonl", '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": -3}\n', "non-positive",
                        "line 1, column output_tokens: -3 is not positive; allowed: an integer >= 1"),
    "non-integer": ("a.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,12.5,5\n", "non-integer",
                    "line 3, column prompt_tokens: non-integer value '12.5'; allowed: an integer >= 1"),
    "non-integer-jsonl": ("a.jsonl", '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2.5}\n', "non-integer",
                          "line 1, column output_tokens: non-integer value 2.5"),
    "non-numeric": ("a.csv", "arrival_s,prompt_tokens,output_tokens\n0,ten,5\n", "non-numeric",
                    "line 2, column prompt_tokens: expected a number, got 'ten'"),
    "non-numeric-jsonl": ("a.jsonl", '{"arrival_s": 0, "prompt_tokens": "5", "output_tokens": 2}\n', "non-numeric",
                          "expected a number, got '5'"),
    "missing-value": ("a.csv", "arrival_s,prompt_tokens,output_tokens\n0,,5\n", "missing-value",
                      "line 2, column prompt_tokens: missing value"),
    "beyond-context": ("a.csv", "arrival_s,prompt_tokens,output_tokens\n0,4000,96\n1,4000,97\n", "beyond-context",
                       "line 3: prompt_tokens + output_tokens = 4000 + 97 = 4097 is beyond llama2-7b's context"),
    "unsorted": ("a.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,5\n2,10,5\n1.5,10,5\n", "unsorted",
                 "line 4, column arrival_s: 1.5 s arrives before line 3's 2 s"),
    "negative-arrival": ("a.csv", "arrival_s,prompt_tokens,output_tokens\n-1,10,5\n", "out-of-range",
                         "is negative; allowed: a finite number >= 0"),
    "nan-arrival": ("a.jsonl", '{"arrival_s": NaN, "prompt_tokens": 5, "output_tokens": 2}\n', "non-numeric",
                    "expected a finite number"),
    "adapter-range": ("a.csv", "arrival_s,prompt_tokens,output_tokens,adapter_id\n0,1,1,-2\n", "out-of-range",
                      "column adapter_id: -2 is too small; allowed: an integer in 0..1000000"),
    "rank-inconsistent": ("a.csv", "arrival_s,prompt_tokens,output_tokens,adapter_id,rank\n0,1,1,4,8\n1,1,1,4,16\n",
                          "inconsistent-rank", "adapter 4 has rank 16 here and 8 on line 2"),
    "empty": ("a.csv", "", "empty", "empty file"),
    "blank-jsonl": ("a.jsonl", "\n", "empty", "no requests"),
    "header-only": ("a.csv", "arrival_s,prompt_tokens,output_tokens\n", "empty", "no requests (only a header)"),
    "ragged": ("a.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1,7\n", "unreadable", "4 cells"),
    "not-json": ("a.jsonl", "{arrival_s: 0}\n", "unreadable", "line 1: not JSON"),
    "format": ("a.txt", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n", "unknown-format", "allowed: .csv, .jsonl"),
}


@pytest.mark.parametrize("case", sorted(BAD_TRACES))
def test_each_bad_trace_gets_its_named_error(case, tmp_path):
    name, text, kind, says = BAD_TRACES[case]
    path = _write(tmp_path, name, text)
    with pytest.raises(TraceFileError) as e:
        load_trace_file(path, max_context=get_model("llama2-7b").max_context,
                        context_source="llama2-7b's context (max_position_embeddings)")
    assert e.value.kind == kind and e.value.kind in TRACE_ERRORS and str(e.value).startswith(f"[{kind}] ")
    assert says in str(e.value) and path in str(e.value), str(e.value)


def test_the_named_errors_of_the_issue_are_all_tested():
    kinds = {v[2] for v in BAD_TRACES.values()}
    assert {"missing-column", "non-positive", "non-integer", "beyond-context", "unsorted"} <= kinds


def test_good_traces_load_as_given(tmp_path):
    w = load_trace_file(_write(tmp_path, "t.csv", GOOD_CSV), max_context=4096)
    assert w.arrival_s.tolist() == [0.0, 0.5, 0.5, 2.0]              # kept as given (ties allowed)
    assert w.prompt_tokens.tolist() == [100, 200, 50, 80] and w.output_tokens.tolist() == [20, 10, 30, 15]
    assert w.adapter_id.tolist() == [3, 7, 3, 1] and w.extra["rank"].tolist() == [16, 8, 16, 64]
    assert w.params["sha256"].startswith("sha256:") and w.params["arrivals"] == "as given"
    j = load_trace_file(_write(tmp_path, "t.jsonl", GOOD_JSONL))
    assert j.arrival_s.tolist() == [1.0, 1.25, 2.0]                  # not shifted to 0
    assert j.prompt_tokens.tolist() == [100, 300, 64] and "['note'] ignored" in " ".join(j.notes)
    assert len(set(j.extra["rank"].tolist()) - {8, 16, 32, 64, 128}) == 0
    assert load_trace_file(_write(tmp_path, "t.csv", GOOD_CSV), n_requests=2).arrival_s.tolist() == [0.0, 0.5]
    bom = load_trace_file(_write(tmp_path, "excel.csv", "\ufeff" + GOOD_CSV.replace("\n", "\r\n")))
    assert bom.prompt_tokens.tolist() == [100, 200, 50, 80]      # a spreadsheet's CSV: byte-order mark, CRLF
    with pytest.raises(TraceFileError) as e:
        load_trace_file(_write(tmp_path, "t.csv", GOOD_CSV), n_requests=5)
    assert e.value.kind == "too-few"


def test_rate_rescales_arrivals_and_says_so(tmp_path):
    j = load_trace_file(_write(tmp_path, "t.jsonl", GOOD_JSONL), rate_per_s=4.0)   # file: 2 gaps over 1 s = 2/s
    assert np.allclose(j.arrival_s, [0.0, 0.125, 0.5])
    assert j.params["rate_per_s_in_file"] == pytest.approx(2.0) and "rescaled from 2 to 4" in " ".join(j.notes)
    with pytest.raises(TraceFileError) as e:
        load_trace_file(_write(tmp_path, "one.csv", "arrival_s,prompt_tokens,output_tokens\n3,1,1\n"), rate_per_s=1.0)
    assert e.value.kind == "cannot-rescale"


# --- the Hugging Face config.json loader ----------------------------------------------------------------------------

@pytest.mark.parametrize("name,hf", [("llama2-7b", LLAMA2_7B_HF), ("qwen3-30b-a3b", QWEN3_30B_A3B_HF),
                                     ("opt-66b", OPT_66B_HF)])
def test_a_known_models_config_json_gives_the_built_in_configuration(name, hf, tmp_path):
    built_in = get_model(name)
    got = load_hf_config(_write(tmp_path, "config.json", hf), name=name, tp=built_in.tp, dp=built_in.dp)
    assert got == built_in                       # every field (sources aside)


def test_the_default_name_comes_from_the_file(tmp_path):
    assert load_hf_config(_write(tmp_path, "config.json", LLAMA2_7B_HF)).name == "llama-2-7b-hf"
    d = {k: v for k, v in LLAMA2_7B_HF.items() if k != "_name_or_path"}
    (tmp_path / "my-model").mkdir()
    assert load_hf_config(_write(tmp_path, "my-model/config.json", d)).name == "my-model"


BAD_HF = {
    "heads": ({"num_attention_heads": -1}, "num_attention_heads must be an integer in 1..1024, got -1"),
    "layers-text": ({"num_hidden_layers": "32"}, "num_hidden_layers must be an integer in 1..1024, got '32'"),
    "layers-fraction": ({"num_hidden_layers": 31.5}, "num_hidden_layers must be an integer in 1..1024, got 31.5"),
    "kv-heads": ({"num_key_value_heads": 5}, "num_key_value_heads must divide num_attention_heads (32), got 5"),
    "missing": ({"hidden_size": None}, "missing key 'hidden_size'"),
    "dtype": ({"torch_dtype": "float32"}, "torch_dtype 'float32' is not modelled; allowed: ['bfloat16', 'float16']"),
    "type": ({"model_type": "bert"}, "model_type 'bert' is not supported; allowed: ['llama'"),
    "vocab": ({"vocab_size": 0}, "vocab_size must be an integer in 1..4194304, got 0"),
}


@pytest.mark.parametrize("case", sorted(BAD_HF))
def test_each_bad_config_value_names_key_and_range(case, tmp_path):
    edit, says = BAD_HF[case]
    d = {k: v for k, v in {**LLAMA2_7B_HF, **edit}.items() if v is not None}
    path = _write(tmp_path, "config.json", d)
    with pytest.raises(ValueError) as e:
        load_hf_config(path)
    assert says in str(e.value) and path in str(e.value), str(e.value)


# --- hardware: TOML and --set ---------------------------------------------------------------------------------------

BAD_SETS = {
    "negative": ("ndp.internal_bw_gbps=-5", "plora", "ndp.internal_bw_gbps must be a number > 0 and <= 100000, got '-5'"),
    "text": ("gpu.sm_count=many", "plora", "gpu.sm_count expected an integer in 1..100000, got 'many'"),
    "fraction": ("gpu.sm_count=1.5", "plora", "gpu.sm_count expected an integer in 1..100000, got '1.5'"),
    "range": ("pim.ranksets=99", "l3", "pim.ranksets must be an integer in 1..32, got '99'"),
    "nan": ("link.bw_gbps=nan", "l3", "link.bw_gbps must be a number > 0 and <= 100000, got 'nan'"),
    "field": ("ndp.ranksets=4", "plora", "no field ndp.ranksets; allowed: ['buffers'"),
    "section-here": ("pim.ranksets=4", "plora", "section [pim] does not apply here; allowed: ['gpu', 'link', 'ndp']"),
    "section": ("dram.x=1", "l3", "unknown section 'dram'; allowed: ['gpu', 'link', 'pim']"),
    "syntax": ("ndp.internal_bw_gbps", "plora", "expected section.field=value"),
    "pow2": ("ndp.lanes=48", "plora", "ndp.lanes must be a power of two in 1..65536, got '48'"),
    "preset": ("gpu.preset=v100", "l3", "gpu.preset must be one of ['a100', 'h100'], got 'v100'"),
}


@pytest.mark.parametrize("case", sorted(BAD_SETS))
def test_each_bad_set_names_field_and_range(case):
    text, cmd, says = BAD_SETS[case]
    with pytest.raises(ValueError) as e:
        parse_set(text, SECTIONS[cmd])
    assert says in str(e.value), str(e.value)


def test_every_field_has_a_range_and_parses_its_own_bounds():
    for section, fields in FIELDS.items():
        for name, f in fields.items():
            assert f.allowed() and f.help, (section, name)
            if f.kind is not str:
                v = f.hi if f.hi is not None else f.lo + 1
                assert f.check(str(v), str(v)) == v


def test_a_hardware_file_is_read_and_checked(tmp_path):
    good = _write(tmp_path, "hw.toml", "[ndp]\ninternal_bw_gbps = 550\nmacs = 2048\n[link]\nrtt_ns = 0\n")
    assert load_hardware(good, SECTIONS["plora"]) == {"ndp": {"internal_bw_gbps": 550.0, "macs": 2048},
                                                      "link": {"rtt_ns": 0.0}}
    for text, says in (("[ndp]\nmacs = 2048.5\n", "ndp.macs must be an integer in 1..1048576, got 2048.5"),
                       ("[ndp]\nmacs = true\n", "ndp.macs must be an integer in 1..1048576, got True"),
                       ("[pim]\nranksets = 4\n", "section [pim] does not apply here"),
                       ("[hbm]\nx = 1\n", "unknown section [hbm]"),
                       ("ndp = 3\n", "ndp must be a table [ndp]"),
                       ("[ndp\n", "not a readable TOML file")):
        with pytest.raises(ValueError) as e:
            load_hardware(_write(tmp_path, "bad.toml", text), SECTIONS["plora"])
        assert says in str(e.value) and "bad.toml" in str(e.value), str(e.value)


# --- the command lines ----------------------------------------------------------------------------------------------

class WorkStarted(Exception):
    pass


def _started(*a, **k):
    raise WorkStarted


@pytest.fixture
def no_work(monkeypatch):
    import host.gpu.model
    import host.l3.run
    import host.plora.run
    for mod, name in ((host.plora.run, "run_spec"), (host.l3.run, "run_l3"), (host.gpu.model, "GPUModel")):
        monkeypatch.setattr(mod, name, _started)


@pytest.fixture
def files(tmp_path):
    f = {"tmp": str(tmp_path), "run": str(tmp_path / "run"), "good": _write(tmp_path, "good.csv", GOOD_CSV)}
    for case, (name, text, _, _) in BAD_TRACES.items():
        f[case] = _write(tmp_path, f"{case}{Path(name).suffix}", text)
    f["llama"] = _write(tmp_path, "llama.json", LLAMA2_7B_HF)
    f["bad_heads"] = _write(tmp_path, "bad_heads.json", {**LLAMA2_7B_HF, "num_attention_heads": 0})
    f["heads64"] = _write(tmp_path, "heads64.json", {**LLAMA2_7B_HF, "num_attention_heads": 64,
                                                     "num_key_value_heads": 64})
    f["qwen"] = _write(tmp_path, "qwen.json", QWEN3_30B_A3B_HF)
    f["opt"] = _write(tmp_path, "opt.json", OPT_66B_HF)
    f["hw_bad"] = _write(tmp_path, "hw_bad.toml", "[ndp]\ninternal_bw_gbps = 0\n")
    f["hw_pim"] = _write(tmp_path, "hw_pim.toml", "[pim]\nranksets = 8\n")
    return f


P = ["plora", "run", "--model", "llama2-7b", "--system", "plora", "--out", "{run}"]
PT = P + ["--trace-file", "{good}"]
L = ["l3", "run", "--model", "opt-66b", "--system", "l3", "--out", "{run}"]
LT = L + ["--trace-file", "{good}"]

# (argv, the flag the message names, what else it says)
BAD_LINES = {
    "plora-missing-column": (P + ["--trace-file", "{missing-column}"], "--trace-file", "[missing-column]"),
    "plora-non-positive": (P + ["--trace-file", "{non-positive}"], "--trace-file", "[non-positive]"),
    "plora-non-integer": (P + ["--trace-file", "{non-integer}"], "--trace-file", "[non-integer]"),
    "plora-beyond-context": (P + ["--trace-file", "{beyond-context}"], "--trace-file",
                             "4097 is beyond llama2-7b's context (max_position_embeddings); allowed: <= 4096"),
    "plora-unsorted": (P + ["--trace-file", "{unsorted}"], "--trace-file", "[unsorted]"),
    "plora-jsonl": (P + ["--trace-file", "{non-integer-jsonl}"], "--trace-file", "[non-integer]"),
    "plora-no-file": (P + ["--trace-file", "{tmp}/none.csv"], "--trace-file", "no such file"),
    "plora-too-few": (PT + ["--requests", "9"], "--requests", "allowed: --requests <= 4"),
    "plora-both-workloads": (PT + ["--workload", "uniform"], "--workload", "give --workload or --trace-file"),
    "plora-no-workload": (P, "--workload", "give --workload or --trace-file"),
    "plora-model-config": (["plora", "run", "--model-config", "{bad_heads}", "--workload", "uniform", "--system",
                            "plora", "--out", "{run}"], "--model-config",
                           "num_attention_heads must be an integer in 1..1024, got 0"),
    "plora-both-models": (PT + ["--model-config", "{llama}"], "--model", "give --model or --model-config"),
    "plora-set": (PT + ["--set", "ndp.internal_bw_gbps=-5"], "--set", "must be a number > 0 and <= 100000"),
    "plora-set-pim": (PT + ["--set", "pim.ranksets=8"], "--set", "section [pim] does not apply here"),
    "plora-hardware": (PT + ["--hardware", "{hw_bad}"], "--hardware", "ndp.internal_bw_gbps must be a number > 0"),
    "plora-hardware-pim": (PT + ["--hardware", "{hw_pim}"], "--hardware", "section [pim] does not apply here"),
    "plora-macs": (PT + ["--set", "ndp.macs=1000"], "--set", "a power of two >= 4"),
    "plora-ndp-on-slora": (["plora", "run", "--model", "llama2-7b", "--system", "s-lora", "--trace-file", "{good}",
                            "--set", "ndp.macs=2048", "--out", "{run}"], "s-lora has no NDP memory device", ""),
    "plora-twice": (PT + ["--set", "link.bw_gbps=64", "--link-gbps", "32"], "--link-gbps",
                    "link.bw_gbps both set the same parameter"),
    "l3-missing-column": (L + ["--trace-file", "{missing-column}"], "--trace-file", "[missing-column]"),
    "l3-unsorted": (L + ["--trace-file", "{unsorted}"], "--trace-file", "[unsorted]"),
    "l3-rate-generated": (L + ["--trace", "openr1", "--rate", "2"], "--rate", "rescales the arrivals of a --trace-file"),
    "l3-set": (LT + ["--set", "pim.ranksets=99"], "--set", "pim.ranksets must be an integer in 1..32, got '99'"),
    "l3-set-ndp": (LT + ["--set", "ndp.macs=2048"], "--set", "section [ndp] does not apply here"),
    "l3-channels": (LT + ["--set", "pim.channels=6"], "--set", "6 host channels cannot be split evenly over DP = 4"),
    "l3-config-no-tp": (["l3", "run", "--model-config", "{llama}", "--system", "l3", "--trace-file", "{good}",
                         "--out", "{run}"], "--tp", "give its TP and DP (--tp, --dp)"),
    "l3-config-moe": (["l3", "run", "--model-config", "{qwen}", "--system", "l3", "--trace-file", "{good}", "--tp",
                       "2", "--dp", "1", "--out", "{run}"], "--model-config", "dense models only"),
    "l3-config-head-dim": (["l3", "run", "--model-config", "{heads64}", "--system", "l3", "--trace-file", "{good}",
                            "--tp", "1", "--dp", "1", "--set", "pim.ranksets=8", "--out", "{run}"], "--model-config",
                           "llama-2-7b-hf: head_dim 64; the DIMM-PIM PAPER geometry computes heads of 128"),
    "l3-tp": (LT + ["--tp", "0"], "--tp", "must be an integer in 1..8, got 0"),
    "l3-tp-dp": (LT + ["--tp", "4", "--dp", "4"], "--tp", "needs 16 GPUs, the dgx-a100 has 8"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_a_bad_input_on_the_command_line_is_one_line_exit_2(case, files, no_work, capsys, monkeypatch):
    argv, flag, says = BAD_LINES[case]
    monkeypatch.chdir(files["tmp"])
    with pytest.raises(SystemExit) as e:
        cli.main([a.format(**files) for a in argv])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "" and "Traceback" not in err, (e.value.code, out, err)
    lines = err.rstrip("\n").splitlines()
    assert [line for line in lines if ": error: " in line] == [lines[-1]]
    assert flag in lines[-1] and says in lines[-1], lines[-1]
    assert not Path(files["run"]).exists()


def test_good_inputs_reach_the_work(files, no_work, monkeypatch):
    """The checks refuse only what they should."""
    monkeypatch.chdir(files["tmp"])
    for argv in (PT, PT + ["--rate", "5", "--requests", "3"], LT, L + ["--trace", "openr1"],
                 ["plora", "run", "--model-config", "{llama}", "--trace-file", "{good}", "--system", "plora",
                  "--set", "ndp.internal_bw_gbps=550", "--out", "{run}"],
                 ["l3", "run", "--model-config", "{opt}", "--tp", "2", "--dp", "4", "--trace-file", "{good}",
                  "--system", "l3", "--hardware", "{hw_pim}", "--set", "gpu.hbm_bw_gbps=1500", "--out", "{run}"]):
        with pytest.raises(WorkStarted):
            cli.main([a.format(**files) for a in argv])


# --- end to end -----------------------------------------------------------------------------------------------------

def _requests(run):
    import pandas as pd
    return pd.read_csv(Path(run) / "requests.csv")


def test_a_csv_trace_runs_end_to_end_on_plora(files, capsys):
    run = files["run"]
    assert cli.main([a.format(**files) for a in PT]) == 0
    out = capsys.readouterr().out
    assert "arrivals as given in the file" in out and "plora on llama2-7b / file:good.csv" in out
    cfg = json.loads((Path(run) / "config.json").read_text())
    from host.workloads.trace_file import file_digest
    assert cfg["inputs"]["trace_file"] == {"path": files["good"], "sha256": file_digest(files["good"]),
                                           "arrivals": "as given"}
    r = _requests(run)
    assert sorted(r["arrival_s"].tolist()) == [0.0, 0.5, 0.5, 2.0] and sorted(r["prompt_tokens"]) == [50, 80, 100, 200]
    assert json.loads((Path(run) / "summary.json").read_text())["finished"] == 4


def test_a_jsonl_trace_runs_rescaled_and_says_so(files, tmp_path, capsys):
    run = str(tmp_path / "j")
    path = _write(tmp_path, "t.jsonl", GOOD_JSONL)
    assert cli.main(["plora", "run", "--model", "llama2-7b", "--system", "s-lora", "--trace-file", path, "--rate",
                     "4", "--out", run]) == 0
    out = capsys.readouterr().out
    assert "arrivals rescaled from 2 to 4 requests/s (--rate)" in out
    assert sorted(_requests(run)["arrival_s"].tolist()) == pytest.approx([0.0, 0.125, 0.5])
    cfg = json.loads((Path(run) / "config.json").read_text())
    assert cfg["inputs"]["trace_file"]["arrivals"] == "rescaled to 4 requests/s"


def test_a_trace_runs_end_to_end_on_l3(files, tmp_path, capsys):
    run = str(tmp_path / "l")
    assert cli.main(["l3", "run", "--model", "opt-66b", "--system", "l3", "--trace-file", files["good"],
                     "--predictor-seed-batches", "0", "--hardware", files["hw_pim"], "--set", "link.bw_gbps=16",
                     "--no-progress", "--out", run]) == 0
    out = capsys.readouterr().out
    assert "arrivals as given in the file" in out and f"pim.ranksets=8 (from {files['hw_pim']} and --set)" in out
    assert json.loads((Path(run) / "summary.json").read_text())["finished"] == 4
    cfg = json.loads((Path(run) / "config.json").read_text())
    assert cfg["setup"]["ranksets"] == 8 and cfg["setup"]["host_link_gbps_per_replica"] == 16.0   # TP 2: one uplink
    assert cfg["inputs"]["hardware"]["values"] == {"pim": {"ranksets": 8}, "link": {"bw_gbps": 16.0}}
    assert cfg["inputs"]["trace_file"]["path"] == files["good"]
    assert sorted(_requests(run)["output_tokens"]) == [10, 15, 20, 30]


# --- hardware reaching the models -----------------------------------------------------------------------------------

def test_ndp_bandwidth_from_toml_and_set_reaches_the_calibrated_model(files, tmp_path):
    from host.plora.run import RunSpec, run_spec
    base = RunSpec(trace_file=files["good"], workload="file", n_requests=None, rate_per_s=None)
    geo = {}
    for bw, hw in (("paper", ()), ("550", (("ndp.internal_bw_gbps", 550.0),))):
        geo[bw] = run_spec(replace(base, hardware=hw)).summary["ndp_geometry"]
    assert "64 LPDDR5X-8533 channels" in geo["paper"] and "32 LPDDR5X-8533 channels" in geo["550"]
    # through the command line: the file says 550 GB/s, --set overrides it with 275 (16 channels)
    hw = _write(tmp_path, "hw.toml", "[ndp]\ninternal_bw_gbps = 550\nmacs = 4096\n")
    run = str(tmp_path / "r")
    assert cli.main([a.format(**files) for a in PT[:-2]] + ["--trace-file", files["good"], "--hardware", hw,
                                                           "--set", "ndp.internal_bw_gbps=275", "--out", run]) == 0
    s = json.loads((Path(run) / "summary.json").read_text())
    assert "16 LPDDR5X-8533 channels" in s["ndp_geometry"] and "512 lanes x 8 PE rows" in s["ndp_geometry"]
    cfg = json.loads((Path(run) / "config.json").read_text())
    assert cfg["inputs"]["hardware"]["values"] == {"ndp": {"internal_bw_gbps": 275.0, "macs": 4096}}
    assert cfg["inputs"]["hardware"]["sha256"].startswith("sha256:")


def test_gpu_and_link_values_reach_the_plora_run(files):
    from host.plora.run import RunSpec, build_system, run_spec
    base = RunSpec(trace_file=files["good"], workload="file", n_requests=None, rate_per_s=None, system="s-lora")
    slow = replace(base, hardware=(("gpu.hbm_bw_gbps", 1000.0), ("link.rtt_ns", 123.0)))
    sys_ = build_system(slow)
    assert sys_.gpu.hbm_bw_gbps == 1000.0 and sys_.gpu_model.gpu.hbm_bw_gbps == 1000.0 and sys_.link.rtt_ns == 123.0
    assert run_spec(slow).summary["tpot_ms_mean"] > 1.5 * run_spec(base).summary["tpot_ms_mean"]


def test_model_config_runs_the_same_as_the_built_in_model(files, tmp_path):
    from host.plora.run import RunSpec, run_spec
    base = RunSpec(trace_file=files["good"], workload="file", n_requests=None, rate_per_s=None)
    a = run_spec(base).summary
    b = run_spec(replace(base, model_config=files["llama"])).summary
    assert a["tpot_ms_mean"] == b["tpot_ms_mean"] and a["ttft_s_mean"] == b["ttft_s_mean"]


def test_hardware_reaches_the_l3_setup_and_gpu_model(files):
    from host.l3.config import l3_setup
    from host.l3.gpu_side import GPUSide
    s = l3_setup("opt-66b", hardware={"pim": {"ranksets": 8}, "gpu": {"hbm_bw_gbps": 1000.0},
                                      "link": {"bw_gbps": 16.0}})
    assert s.host.ranksets == 8 and s.host_link.bw_gbps == 16.0 and s.node.gpu.hbm_bw_gbps == 1000.0
    assert s.describe()["ranksets"] == 8
    assert l3_setup("opt-66b", ranksets=2, hardware={"pim": {"ranksets": 8}}).host.ranksets == 2   # the flag on top
    g, g0 = GPUSide(s), GPUSide(l3_setup("opt-66b"))
    assert g.g.gpu.hbm_bw_gbps == 1000.0 and g0.g.gpu.hbm_bw_gbps == 2039
    assert float(g.fc(1, 1)) > float(g0.fc(1, 1))         # a decode step's weights stream at the slower HBM
    m = load_hf_config(files["opt"], tp=2, dp=4)
    assert l3_setup(m, tp=2, dp=4).describe()["tp"] == 2


def test_a_run_is_reproduced_from_its_config_json(files, tmp_path):
    """config.json's spec (lists where the RunSpec had tuples) runs the same run again."""
    from host.plora.run import RunSpec, run_spec
    run = str(tmp_path / "r")
    assert cli.main([a.format(**files) for a in PT[:-2]] + ["--trace-file", files["good"], "--set",
                                                           "ndp.internal_bw_gbps=550", "--rate", "3", "--out", run]) == 0
    cfg = json.loads((Path(run) / "config.json").read_text())
    again = run_spec(RunSpec(**cfg["spec"])).summary
    s = json.loads((Path(run) / "summary.json").read_text())
    assert again["tpot_ms_mean"] == pytest.approx(s["tpot_ms_mean"], rel=1e-12)
    assert again["ndp_geometry"] == s["ndp_geometry"] and "32 LPDDR5X" in s["ndp_geometry"]
