"""Bad input to ``inspect`` is refused before any trace or compile, with the value and the rule named; the CLI
exits 2. Each case is also the report's list of bad inputs (message + exit status)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shardlab.inspect.config import InspectConfig, InspectInputError, make_config

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256}


def cfg(model: str = "llama-3-8b", **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("mesh", "fsdp=8")
    kw.setdefault("topology", "v5e-8")
    kw.setdefault("num_layers", 2)
    kw.setdefault("seq", 64)
    kw.setdefault("overrides", TINY if model != "gpt2" else {})
    return make_config(model, **kw)


def test_slice_names_one_form() -> None:
    """make_config (the public entry) accepts libtpu's v6e:8x8 and stores the one form, v6e-64; the config itself
    takes only that form."""
    assert cfg(topology="v6e:8x8", mesh="fsdp=64").topology == cfg(topology="v6e-64", mesh="fsdp=64").topology == \
        "v6e-64"
    assert cfg(topology="v5e:2x4").validate(model=False).topology == "v5e-8"
    raw = InspectConfig(cfg().model_json, topology="v5e:2x4")
    with pytest.raises(InspectInputError, match=r"topology='v5e:2x4': unknown topology .*generation:shape form"):
        raw.validate(model=False)


BAD = [  # (what, config keywords, message pattern)
    ("unknown slice", dict(topology="v7x-8"), r"topology='v7x-8' is not a known TPU slice; known slices: v5e-1"),
    ("a slice name that is not Cloud TPU's", dict(topology="v5p-4", mesh="fsdp=2"),
     r"topology='v5p-4' is not a known TPU slice; .*v5p has no slice with N = 4 \(TensorCores\)"),
    ("a mesh that does not tile the slice", dict(mesh="fsdp=4"),
     r"mesh fsdp=4 = 4 devices does not tile v5e-8 \(8 chips\)"),
    ("a batch the mesh cannot divide", dict(batch=12), r"batch=12 is not divisible by the batch axes fsdp = 8"),
    ("an axis named twice", dict(mesh=(("fsdp", 2), ("fsdp", 4))), r"names an axis twice"),
    ("an FSDP axis the mesh lacks", dict(fsdp="data"), r"fsdp axis 'data' is not a mesh axis"),
    ("heads the tensor axis cannot divide", dict(mesh="fsdp=1,tensor=8", batch=1),
     r"heads=4 is not divisible by tensor=8"),
    ("a rule that matches nothing", dict(rules={r"q_porj\.weight$": "tensor,-"}),
     r"rule 'q_porj\\\\.weight\$' matches no parameter"),
    ("a spec of the wrong rank", dict(rules={r"up_proj\.weight$": "fsdp"}), r"the spec \('fsdp',\) of length 1"),
    ("strict coverage", dict(strict=True), r"strict: parameter 'model.embed_tokens.weight' is covered by no rule"),
    ("scan with different layers", dict(rules={r"layers\.0\.mlp\.up_proj": "-,fsdp"}),
     r"layers='scan' stacks 'mlp.up_proj.weight' .* use layers='loop'"),
    ("an unknown recompute policy", dict(recompute="some"), r"recompute='some' must be one of"),
    ("selective recompute in HF's loop", dict(recompute="selective", layers="loop"),
     r"recompute='selective' needs a partition .* use layers='scan'"),
    ("flash attention with a sliding window", dict(attention="flash", overrides={**TINY, "sliding_window": 16},
                                                   model="mistral-7b"),
     r"attention='flash': mistral uses a sliding window of 16 tokens"),
    ("an unknown attention kernel", dict(attention="xformers"), r"attention='xformers' must be one of"),
    ("flash with a sequence its blocks do not tile", dict(attention="flash", seq=384),
     r"attention='flash': seq=384 is not tiled by the kernel's blocks"),
    ("host offload in HF's loop", dict(recompute="offload", layers="loop"),
     r"recompute='offload' moves the layer inputs .* use layers='scan'"),
    ("an unknown optimizer", dict(optimizer="lion"), r"optimizer='lion' must be one of \('adamw', 'adafactor'"),
    ("an optimizer spelt as its class", dict(optimizer="AdamW"), r"optimizer='AdamW' must be one of"),
    ("an optimizer dtype other than fp32 / bf16", dict(optimizer_dtype="fp16"),
     r"optimizer_dtype='fp16' must be one of \('fp32', 'bf16'\)"),
]


@pytest.mark.parametrize("what,kw,pattern", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_named_before_any_compile(what: str, kw: dict, pattern: str) -> None:
    with pytest.raises(InspectInputError, match=pattern):
        cfg(**kw).validate()


def test_bad_models_are_named() -> None:
    with pytest.raises(InspectInputError, match="neither a preset"):
        make_config("no-such-model")
    with pytest.raises(InspectInputError, match="cannot be built"):
        cfg(overrides={**TINY, "hidden_act": "no-such-activation"}).validate()
    with pytest.raises(InspectInputError, match=r"seq=2048 is longer than the 1024 learned position embeddings"):
        cfg("gpt2", seq=2048).validate()


def test_cli_exits_2_naming_the_rule(tmp_path, capfd) -> None:  # type: ignore[no-untyped-def]
    p = subprocess.run([sys.executable, "-m", "shardlab", "inspect", "llama-3-8b", "--topology", "v7x-8", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "topology='v7x-8' is not a known TPU slice" in p.stderr and p.stdout == ""
    from shardlab.__main__ import main  # in this process: the model build needs transformers, already imported

    bad = tmp_path / "bad.json"
    bad.write_text('{"model_type": "llama", "hidden_act": "no-such-activation", "num_hidden_layers": 1}')
    for argv, pattern in (([str(bad), "--topology", "v5e-8"], "cannot be built"),
                          (["gpt2", "--topology", "v5e-8", "--mesh", "fsdp=8", "--batch", "4"],
                           "batch=4 is not divisible"),
                          (["gpt2", "--topology", "v5e-8", "--rule", "nothing_like_this=fsdp"],
                           "matches no parameter")):
        capfd.readouterr()
        assert main(["inspect", *argv, "--quiet"]) == 2
        out, err = capfd.readouterr()
        assert pattern in err and out == "", (argv, err)


def test_nearest_fit_is_the_closest_plan_the_planner_accepts() -> None:
    """Brute force over the planner (no compile): the plan returned fits, and when it sits on a larger slice no
    mesh / recompute choice on the original slice fits."""
    from shardlab import planner as P
    from shardlab.inspect import analysis as A

    cfg = make_config("llama-3-8b", mesh="fsdp=8", topology="v5e-8", batch=8, seq=8192).validate()
    near = A.nearest_fit(cfg)
    assert near is not None and near.fits
    c = near.config
    if c.topology != cfg.topology:
        for t in (1, 2, 4, 8):
            for f in (1, 2, 4, 8):
                if 8 % (t * f):
                    continue
                for rc in ("full", "none"):
                    try:
                        p = P.plan(A.plan_config(cfg, data=8 // (t * f), fsdp=f, tensor=t, recompute=rc))
                    except ValueError:
                        continue
                    assert not p.fits, (t, f, rc)


# ------------------------------------------------------------------------------------------- the command line
# (argv, the message's words): every one exits 2 before the device world starts, nothing on stdout. The first
# five are a JSON array as config, zero layers, a non-integer --set, an unknown optimizer, a misspelt field; the
# rest are inputs that used to end in a traceback deep in the model code or in a silent no-op.
def _config_files(tmp_path):  # type: ignore[no-untyped-def]
    files = {"array": "[1, 2, 3]", "null": "null",
             "zero_layers": '{"model_type": "llama", "num_hidden_layers": 0}',
             "type_int": '{"model_type": 5}',
             "t5": '{"model_type": "t5"}',
             "kv3": '{"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 3, "hidden_size": 64}',
             "topk": '{"model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 3}',
             "window0": '{"model_type": "mistral", "sliding_window": 0}',
             "pad": '{"model_type": "phi3", "vocab_size": 512, "pad_token_id": 32000}',
             "mla_kv": '{"model_type": "deepseek_v3", "num_attention_heads": 4, "num_key_value_heads": 2}'}
    out = {}
    for name, text in files.items():
        out[name] = tmp_path / f"{name}.json"
        out[name].write_text(text)
    return out


CLI_BAD = [  # (id, argv builder, words in the message)
    ("a JSON array as config", lambda f: [str(f["array"])], "holds a JSON list, not an object"),
    ("num_hidden_layers 0", lambda f: [str(f["zero_layers"])], "num_hidden_layers=0 must be an integer >= 1"),
    ("--set hidden_size=abc", lambda f: ["llama-3-8b", "--set", "hidden_size=abc"],
     "override hidden_size='abc' must be an integer"),
    ("--set a misspelt field", lambda f: ["llama-3-8b", "--set", "hiden_size=256"],
     "no field 'hiden_size' (did you mean 'hidden_size'?)"),
    ("--set without a field name", lambda f: ["llama-3-8b", "--set", "=5"], "no field name before '='"),
    ("--set a flag to a number", lambda f: ["llama-3-8b", "--set", "tie_word_embeddings=5"],
     "must be true or false"),
    ("JSON null as config", lambda f: [str(f["null"])], "holds a JSON NoneType, not an object"),
    ("model_type not a string", lambda f: [str(f["type_int"])], "model_type=5 must be a string"),
    ("an encoder-decoder", lambda f: [str(f["t5"])], "is an encoder-decoder: inspect builds decoder-only"),
    ("kv heads that do not divide the heads", lambda f: [str(f["kv3"])], "not a multiple of num_key_value_heads=3"),
    ("top-k above the expert count", lambda f: [str(f["topk"])], "num_experts_per_tok=3 is more than the 2 experts"),
    ("a zero sliding window", lambda f: [str(f["window0"])], "sliding_window=0 must be None or an integer >= 1"),
    ("a padding id outside the vocabulary", lambda f: [str(f["pad"])], "pad_token_id=32000 is not a row of the 512"),
    ("DeepSeek-V3 with fewer kv heads", lambda f: [str(f["mla_kv"])], "must equal num_attention_heads=4"),
    ("--html naming a directory", lambda f: ["gpt2", "--html", str(f["array"].parent)], "is a directory"),
    ("scan over DeepSeek-V3's dense and MoE layers",
     lambda f: ["deepseek_v3", "--layers", "scan"], "decoder layer 1 holds other parameters than layer 0"),
]


@pytest.mark.parametrize("what,argv,words", CLI_BAD, ids=[b[0] for b in CLI_BAD])
def test_cli_bad_input_exits_2_before_any_compile(what: str, argv, words: str, tmp_path, capfd,  # type: ignore
                                                  monkeypatch) -> None:
    from shardlab import runtime
    from shardlab.__main__ import main
    from shardlab.inspect import families

    files = _config_files(tmp_path)
    if argv(files)[0] == "deepseek_v3":  # the family's own tiny config, as a file (3 layers: dense, MoE, MoE)
        path = tmp_path / "deepseek.json"
        path.write_text(__import__("json").dumps(families.tiny_family("deepseek_v3", 3)))
        files["deepseek"] = path
        args = [str(path), *argv(files)[1:]]
    else:
        args = argv(files)
    monkeypatch.setattr(runtime, "setup", lambda **_: pytest.fail("the device world started on bad input"))
    capfd.readouterr()
    assert main(["inspect", *args, "--topology", "v5e-8", "--mesh", "fsdp=8", "--quiet"]) == 2, what
    out, err = capfd.readouterr()
    assert words in err and out == "" and "Traceback" not in err, (what, err)


def test_cli_rejects_an_unknown_optimizer_and_names_the_choices(capfd) -> None:  # type: ignore[no-untyped-def]
    from shardlab.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["inspect", "gpt2", "--optimizer", "lion"])
    assert exc.value.code == 2 and "invalid choice: 'lion'" in capfd.readouterr().err


@pytest.mark.parametrize("argv,words", [(["--optimizer-dtype", "fp16"], "invalid choice: 'fp16'"),
                                        (["--optimizer", "adam"], "invalid choice: 'adam'")])
def test_cli_rejects_an_unknown_optimizer_dtype(argv: list[str], words: str, capfd) -> None:  # type: ignore
    from shardlab.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["inspect", "gpt2", *argv])
    assert exc.value.code == 2 and words in capfd.readouterr().err


def test_cli_internal_error_exits_3_with_the_traceback_in_a_file(capfd, monkeypatch) -> None:  # type: ignore
    """A failure of inspect itself (here: validation raising something that is not bad input) is exit 3, one line
    on the terminal and the whole traceback in a file whose path is printed."""
    import re
    from pathlib import Path

    from shardlab.__main__ import main

    def broken(self, model=True):  # type: ignore[no-untyped-def]
        raise RuntimeError("simulated bug in inspect")

    monkeypatch.setattr(InspectConfig, "validate", broken)
    capfd.readouterr()
    assert main(["inspect", "gpt2", "--topology", "v5e-8", "--quiet"]) == 3
    out, err = capfd.readouterr()
    assert out == "" and "inspect itself failed (RuntimeError: simulated bug in inspect)" in err
    path = Path(re.search(r"Traceback: (\S+)", err).group(1))
    text = path.read_text()
    assert "Traceback (most recent call last)" in text and "in broken" in text
    path.unlink()


def test_help_names_exit_codes_kernel_dtypes_and_what_is_measured(capfd) -> None:  # type: ignore[no-untyped-def]
    from shardlab.__main__ import main

    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    text = capfd.readouterr().out
    for words in ("0  the step fits", "1  it does not fit", "2  bad input", "3  inspect itself failed",
                  "eager", "bf16", "fp32", "int64", "measured =", "derived  =", "--optimizer-dtype bf16: no master",
                  "adafactor", "sgd-momentum", "row_var + col_var", "--recompute offload", "S(5)"):
        assert words in text, words
