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
    ("an unknown recompute policy", dict(recompute="selective"), r"recompute='selective' must be one of"),
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
