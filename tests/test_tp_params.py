"""The TP notebooks' up-front validation names the parameter and the rule."""

import pytest

from shardlab.tp.params import check_tp_params

OK = dict(num_devices=8, tp=4, batch=2, seq=8, hidden=64, ffn=256, heads=8, vocab=1000, dtype="float32")


def test_valid() -> None:
    check_tp_params(**OK, divisible=("hidden", "ffn", "heads"))


@pytest.mark.parametrize("change,divisible,msg", [
    ({"hidden": 0}, (), "hidden=0 must be a positive int"),
    ({"tp": True}, (), "tp=True must be a positive int"),
    ({"dtype": "fp8"}, (), "dtype='fp8' must be one of"),
    ({"tp": 16}, (), "tp=16 is larger than the device count num_devices=8"),
    ({"tp": 3, "num_devices": 8}, (), "num_devices=8 is not divisible by tp=3"),
    ({"ffn": 100, "tp": 8}, ("ffn",), "ffn=100 is not divisible by tp=8"),
    ({"heads": 6}, ("heads",), "heads=6 is not divisible by tp=4"),
    ({}, ("vocab",), "'vocab' is not one of"),
])
def test_bad(change: dict, divisible: tuple, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        check_tp_params(**{**OK, **change}, divisible=divisible)
