"""Sharding rules of ``shardlab.inspect``: specs, errors, per-chip shapes, mesh axes of replica groups.

Oracles: the hand-written specs of the planner's own compile check (``planner.verdict.LAYER_SPECS``: the Megatron
+ FSDP layout of a Llama layer, written independently of these rules), the published module layouts (HF
``Conv1D`` is ``[in, out]``), and replica groups written out by hand from ``np.arange(n).reshape(mesh)``.
No XLA: pure functions.
"""

from __future__ import annotations

import pytest

from shardlab.inspect import sharding as S
from shardlab.inspect.analysis import group_axes, pair_axes, sub_axes
from shardlab.inspect.models import Param
from shardlab.planner.verdict import LAYER_SPECS

MESH = {"fsdp": 8, "tensor": 2}
LLAMA = {  # HF Llama 3 8B names and [out, in] shapes -> planner.verdict's names
    "q": ("self_attn.q_proj.weight", (4096, 4096)), "k": ("self_attn.k_proj.weight", (1024, 4096)),
    "v": ("self_attn.v_proj.weight", (1024, 4096)), "o": ("self_attn.o_proj.weight", (4096, 4096)),
    "gate": ("mlp.gate_proj.weight", (14336, 4096)), "up": ("mlp.up_proj.weight", (14336, 4096)),
    "down": ("mlp.down_proj.weight", (4096, 14336)), "ln1": ("input_layernorm.weight", (4096,)),
    "ln2": ("post_attention_layernorm.weight", (4096,)),
}


def _param(name: str, shape: tuple[int, ...]) -> Param:
    return Param(name, shape, (("", name),))


def test_llama_layer_specs_match_the_planner_checks_hand_written_layout() -> None:
    tp = S.megatron_rules("tensor")
    for short, (suffix, shape) in LLAMA.items():
        spec = S.spec_for(f"model.layers.3.{suffix}", shape, [], tp, ("fsdp",), 8, MESH)
        assert spec == LAYER_SPECS[short], (short, spec)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):  # [V_tensor, H_fsdp] in planner_verdict.build
        assert S.spec_for(name, (128256, 4096), [], tp, ("fsdp",), 8, MESH) == ("tensor", "fsdp")


def test_gpt2_conv1d_is_in_out() -> None:
    tp = S.megatron_rules("tensor")
    # Conv1D weight [in, out]: c_attn / c_fc split their outputs (dim 1), c_proj its inputs (dim 0)
    assert S.spec_for("transformer.h.0.attn.c_attn.weight", (768, 2304), [], tp, (), 1, MESH) == (None, "tensor")
    assert S.spec_for("transformer.h.0.mlp.c_fc.bias", (3072,), [], tp, (), 1, MESH) == ("tensor",)
    assert S.spec_for("transformer.h.0.mlp.c_proj.weight", (3072, 768), [], tp, (), 1, MESH) == ("tensor", None)
    assert S.spec_for("transformer.h.0.attn.c_proj.bias", (768,), [], tp, (), 1, MESH) == (None,)  # row bias
    assert S.spec_for("transformer.wpe.weight", (1024, 768), [], tp, (), 1, MESH) == (None, None)


def test_mixtral_experts_and_router() -> None:
    tp = S.megatron_rules("tensor")
    base = "model.layers.0.block_sparse_moe"
    assert S.spec_for(f"{base}.experts.5.w1.weight", (14336, 4096), [], tp, (), 1, MESH) == ("tensor", None)
    assert S.spec_for(f"{base}.experts.5.w2.weight", (4096, 14336), [], tp, (), 1, MESH) == (None, "tensor")
    assert S.spec_for(f"{base}.gate.weight", (8, 4096), [], tp, (), 1, MESH) == (None, None)  # router replicated


def test_fsdp_takes_the_first_free_dimension_it_divides() -> None:
    assert S.fsdp_dim((50257, 768), (None, None), 8) == 1  # 50257 is odd: 768 = 8 x 96
    assert S.fsdp_dim((50257, 4), (None, None), 8) == 0  # none divides: the largest, padded
    assert S.fsdp_dim((1, 768), (None, None), 8) == 1  # a size-1 dimension is never split
    assert S.fsdp_dim((768,), ("tensor",), 8) is None  # nothing free


def test_user_rules_come_first_and_fsdp_fills_in() -> None:
    user = [S.Rule(r"down_proj\.weight$", (None, "fsdp"), "user")]
    tp = S.megatron_rules("tensor")
    # the user's rule already uses fsdp: FSDP adds nothing; without fsdp in it, FSDP takes a free dimension
    assert S.spec_for("m.layers.0.mlp.down_proj.weight", (4096, 14336), user, tp, ("fsdp",), 8, MESH) == \
        (None, "fsdp")
    user = [S.Rule(r"down_proj\.weight$", (None, None), "user")]
    assert S.spec_for("m.layers.0.mlp.down_proj.weight", (4096, 14336), user, tp, ("fsdp",), 8, MESH) == \
        ("fsdp", None)


def test_fsdp_over_two_axes() -> None:
    mesh = {"data": 2, "fsdp": 4}
    assert S.spec_for("w", (64, 8), [], [], ("data", "fsdp"), 8, mesh) == (("data", "fsdp"), None)
    assert S.local_shape((64, 8), (("data", "fsdp"), None), mesh) == (8, 8)


def test_local_shape_pads_uneven_dimensions() -> None:
    assert S.local_shape((50257, 768), ("tensor", "fsdp"), {"tensor": 8, "fsdp": 4}) == (6283, 192)  # ceil


def test_parse_spec_and_rules() -> None:
    assert S.parse_spec("fsdp,-") == ("fsdp", None)
    assert S.parse_spec("None,data+fsdp") == (None, ("data", "fsdp"))
    assert S.normalize_rules({"lm_head": "tensor,-"}) == (("lm_head", ("tensor", None)),)
    with pytest.raises(S.PlanInputError, match=r"rule '\(\[' : not a regular expression|not a regular expression"):
        S.normalize_rules({"([": "fsdp"})


PARAMS = [_param("model.layers.0.mlp.up_proj.weight", (512, 128)), _param("model.norm.weight", (128,))]


def test_a_rule_that_matches_nothing_is_named() -> None:
    with pytest.raises(S.PlanInputError, match=r"rule 'q_porj' matches no parameter"):
        S.resolve(PARAMS, (("q_porj", ("tensor", None)),), None, ("fsdp",), MESH)


def test_strict_names_the_uncovered_parameter() -> None:
    with pytest.raises(S.PlanInputError, match=r"strict: parameter 'model.norm.weight' is covered by no rule"):
        S.resolve(PARAMS, (), "tensor", ("fsdp",), MESH, strict=True)
    specs, origin = S.resolve(PARAMS, ((r"norm", (None,)),), "tensor", ("fsdp",), MESH, strict=True)
    assert origin == {"model.layers.0.mlp.up_proj.weight": "megatron column", "model.norm.weight": "user"}


def test_bad_specs_name_parameter_and_rule() -> None:
    with pytest.raises(S.PlanInputError, match=r"rule 'up_proj' \(user\) gives model.layers.0.mlp.up_proj.weight "
                                               r"\(shape \[512, 128\], rank 2\) the spec \('fsdp',\) of length 1"):
        S.resolve(PARAMS, (("up_proj", ("fsdp",)),), None, (), MESH)
    with pytest.raises(S.PlanInputError, match=r"uses mesh axis 'model' .* mesh has only \['fsdp', 'tensor'\]"):
        S.resolve(PARAMS, (("up_proj", ("model", None)),), None, (), MESH)
    with pytest.raises(S.PlanInputError, match=r"uses a mesh axis twice"):
        S.resolve(PARAMS, (("up_proj", ("fsdp", "fsdp")),), None, (), MESH)


MESH3 = (("a", 2), ("b", 2), ("c", 2))  # ids = np.arange(8).reshape(2, 2, 2): id = 4a + 2b + c


def test_group_axes_by_hand() -> None:
    assert group_axes([[0, 4], [1, 5], [2, 6], [3, 7]], MESH3) == ("a",)
    assert group_axes([[0, 2], [1, 3], [4, 6], [5, 7]], MESH3) == ("b",)
    assert group_axes([[0, 1], [2, 3], [4, 5], [6, 7]], MESH3) == ("c",)
    assert group_axes([[0, 1, 4, 5], [2, 3, 6, 7]], MESH3) == ("a", "c")
    assert group_axes([[7, 6, 5, 4, 3, 2, 1, 0]], MESH3) == ("a", "b", "c")  # order inside a group is free
    assert group_axes([[0, 3], [1, 2], [4, 7], [5, 6]], MESH3) is None  # not a set of whole axes
    assert group_axes([[0, 2], [1, 3]], (("data", 1), ("x", 2), ("y", 2))) == ("x",)  # size-1 axes ignored


def test_sub_axes_and_pairs_by_hand() -> None:
    assert sub_axes([[0, 2], [1, 3], [4, 6], [5, 7]], (("fsdp", 4), ("tensor", 2))) == "fsdp (groups of 2)"
    assert pair_axes([[0, 2], [2, 0], [4, 6], [6, 4]], MESH3) == ("b",)
    assert pair_axes([[0, 7]], MESH3) == ("a", "b", "c")
