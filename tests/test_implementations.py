"""What a backend can compute a primitive with, and which one a call gets, asked through the
public functions (``polyconv.implementations``, ``polyconv.default_implementation``,
``polyconv.measured``), here on the numpy backend, checked against its own tables, its cost
model and what calls run; the JAX backend's side is in tests/test_jax_choice.py."""

from __future__ import annotations

import logging

import numpy as np
import polyconv_numpy
import pytest

import polyconv

PRIMITIVES = ("forward", "backward_data", "backward_weights")
#: plans whose applicable strategies differ: dense, depthwise, non-overlapping windows, NCX
PLANS = [
    polyconv.infer_shape("convolution", (2, 16, 16, 32), (3, 3, 32, 16), strides=2,
                         pads_begin=1, pads_end=1),
    polyconv.infer_shape("convolution", (2, 16, 16, 32), (3, 3, 1, 32), groups=32,
                         pads_begin=1, pads_end=1),
    polyconv.infer_shape("conv_transpose", (2, 8, 8, 16), (2, 2, 8, 16), strides=2),
    polyconv.infer_shape("convolution", (2, 8, 12, 12), (16, 8, 3, 3), data_format="NCX",
                         weights_format="OIX"),
]


def test_the_listing_is_the_backends_own_table():
    for primitive in PRIMITIVES:
        own = tuple(s.name for s in polyconv_numpy.STRATEGIES if s.primitive == primitive)
        assert polyconv.implementations("numpy", primitive) == own


@pytest.mark.parametrize("plan", PLANS, ids=range(len(PLANS)))
def test_the_applicable_ones_are_those_forcing_honours(plan, caplog):
    caplog.set_level(logging.DEBUG, logger="polyconv")
    plan = plan.with_(dtype="float32")
    x, w = (np.ones(s, np.float32) for s in plan.operand_shapes())
    op = getattr(polyconv, plan.op)
    applicable = polyconv.implementations("numpy", plan.primitive, plan)
    assert applicable and set(applicable) <= set(polyconv.implementations("numpy",
                                                                          plan.primitive))
    for name in polyconv.implementations("numpy", plan.primitive):
        caplog.clear()
        with polyconv.implementation(f"numpy:{plan.primitive}={name}"):
            op(x, w, backend="numpy", data_format=plan.data_format,
               weights_format=plan.weights_format, strides=plan.strides,
               pads_begin=plan.pads_begin, pads_end=plan.pads_end, groups=plan.groups)
        honoured = any(f"-> {name} (forced)" in r.getMessage() for r in caplog.records)
        assert honoured == (name in applicable), name


@pytest.mark.parametrize("plan", PLANS, ids=range(len(PLANS)))
def test_the_default_is_the_cheapest_priced_and_what_a_call_runs(plan, caplog):
    caplog.set_level(logging.DEBUG, logger="polyconv")
    plan = plan.with_(dtype="float32")
    for primitive in PRIMITIVES:
        costs = polyconv_numpy.costs(primitive, plan)
        pick = polyconv.default_implementation("numpy", primitive, plan)
        assert pick == min(costs, key=costs.__getitem__)
        # a cost model is the same on every platform
        assert polyconv.default_implementation("numpy", primitive, plan, platform="gpu") == pick
    x, w = (np.ones(s, np.float32) for s in plan.operand_shapes())
    caplog.clear()
    getattr(polyconv, plan.op)(x, w, backend="numpy", data_format=plan.data_format,
                               weights_format=plan.weights_format, strides=plan.strides,
                               pads_begin=plan.pads_begin, pads_end=plan.pads_end,
                               groups=plan.groups)
    pick = polyconv.default_implementation("numpy", plan.primitive, plan)
    assert any(f"numpy {plan.primitive}" in r.getMessage() and f"-> {pick} (default)"
               in r.getMessage() for r in caplog.records)


def test_measured_gives_each_candidates_seconds_beside_the_choice(monkeypatch):
    monkeypatch.delenv("POLYCONV_AUTOTUNE_CACHE", raising=False)
    polyconv_numpy.CHOOSER.forget()
    # large enough to be measured (over 1 ms by the model) and with several candidates
    x = np.ones((8, 32, 32, 64), np.float32)
    w = np.ones((3, 3, 64, 64), np.float32)
    try:
        with polyconv.autotune():
            polyconv.convolution(x, w, pads_begin=1, pads_end=1, backend="numpy")
        times, chosen = polyconv.measured(), polyconv.chosen()
    finally:
        polyconv_numpy.CHOOSER.forget()
    (key,) = [k for k in times if k.startswith("numpy|")]
    assert "|forward|" in key and len(times[key]) > 1
    assert chosen[key] in times[key] and all(t > 0 for t in times[key].values())


@pytest.mark.parametrize(("call", "words"), [
    (lambda: polyconv.implementations("nope", "forward"), ["backend='nope'", "numpy"]),
    (lambda: polyconv.implementations("array_api", "forward"),
     ["backend='array_api'", "nothing to choose", "numpy"]),
    (lambda: polyconv.default_implementation("numpy", "backward", PLANS[0]),
     ["primitive='backward'", "backward_data"]),
])
def test_bad_questions_name_the_argument_and_the_choices(call, words):
    with pytest.raises(ValueError) as info:
        call()
    assert all(word in str(info.value) for word in words), str(info.value)
