"""Activation memory (Korthikanti et al. 2022) against the paper's own numbers and equations.

Oracles: the paper's quoted values (5as/h = 80 for GPT-3, ~70 % saving of selective recompute for GPT-3 and
65 % for MT-NLG 530B) and its closed forms eq. (1), (2), (4), written out again here from the paper — the
per-term implementation must add up to them exactly (integer arithmetic in floats < 2^53: exact).
"""

import pytest

from shardlab.formulas import activations as A

GPT3 = dict(seq=2048, hidden=12288, heads=96)  # Korthikanti Table 3 / Brown et al.
MTNLG = dict(seq=2048, hidden=20480, heads=128)  # MT-NLG 530B


def test_gpt3_attention_ratio_is_80():
    # paper, section 4.1: "for GPT-3 ... 5as/h = 80"
    assert A.attention_score_ratio(GPT3["heads"], GPT3["seq"], GPT3["hidden"]) == 80.0


def test_selective_recompute_saves_70_percent_gpt3_and_65_percent_mtnlg():
    # paper, section 5: selective recomputation reduces activation memory by 70 % (GPT-3), 65 % (MT-NLG)
    assert round(A.selective_recompute_saving(GPT3["heads"], GPT3["seq"], GPT3["hidden"]), 2) == 0.70
    assert round(A.selective_recompute_saving(MTNLG["heads"], MTNLG["seq"], MTNLG["hidden"]), 2) == 0.65


@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("t", [1, 2, 8])
def test_terms_add_up_to_paper_equations(t, b):
    s, h, a = GPT3["seq"], GPT3["hidden"], GPT3["heads"]
    sbh = s * b * h
    eq1 = sbh * (34 + 5 * a * s / h)
    eq2 = sbh * (10 + 24 / t + 5 * a * s / (h * t))
    eq4 = sbh / t * (34 + 5 * a * s / h)
    assert A.activation_bytes_per_layer(s, b, h, a).total == eq1
    assert A.activation_bytes_per_layer(s, b, h, a, tp=t).total == pytest.approx(eq2, rel=1e-12)
    assert A.activation_bytes_per_layer(s, b, h, a, tp=t, sequence_parallel=True).total == pytest.approx(
        eq4, rel=1e-12
    )
    # selective recompute with TP + SP: 34·sbh/t ; full recompute keeps 2·sbh (layer input)
    sel = A.activation_bytes_per_layer(s, b, h, a, tp=t, sequence_parallel=True, recompute="selective")
    assert sel.total == pytest.approx(34 * sbh / t, rel=1e-12)
    assert A.activation_bytes_per_layer(s, b, h, a, tp=t, recompute="full").total == 2 * sbh


def test_per_term_breakdown_without_parallelism():
    # section 4.1: attention 11sbh + 5as²b, MLP 19sbh, layer norms 4sbh
    s, b, h, a = 2048, 2, 12288, 96
    terms = A.activation_bytes_per_layer(s, b, h, a)
    assert terms.attention == 11 * s * b * h + 5 * a * s * s * b
    assert terms.mlp == 19 * s * b * h
    assert terms.layernorm == 4 * s * b * h


def test_bad_input_names_values():
    with pytest.raises(ValueError, match="heads=96 is not divisible by tp=5"):
        A.activation_bytes_per_layer(2048, 1, 12288, 96, tp=5)
    with pytest.raises(ValueError, match="recompute='some'"):
        A.activation_bytes_per_layer(2048, 1, 12288, 96, recompute="some")
