"""inference/advisor: interpolation between measured points, and the speeds file's schema."""

from __future__ import annotations

from typing import Any

import pytest

from inference.advisor.curves import Curve, Grid
from inference.advisor.errors import InputError
from inference.advisor.speeds import Batching, speeds_from_json


def valid() -> dict[str, Any]:
    return {"prefill_ms": {"batch": [1, 4], "tokens": [100, 1000], "ms": [[50, 500], [80, 530]]},
            "decode_step_ms": {"batch": [1, 9], "context": [100, 1100], "ms": [[20, 30], [40, 60]]},
            "handoff_ms": {"tokens": [100, 1000], "ms": [2, 11]}}


def test_a_curve_passes_through_its_points_and_is_straight_between_them() -> None:
    curve = Curve.checked([100, 200, 400], [10, 30, 40], "c")
    assert [curve(x) for x in (100, 150, 200, 300, 400)] == pytest.approx([10, 20, 30, 35, 40])


def test_below_the_first_point_the_first_value_holds() -> None:
    assert Curve.checked([100, 200], [10, 30], "c")(1) == pytest.approx(10)


def test_above_the_last_point_the_last_slope_goes_on_but_never_down() -> None:
    assert Curve.checked([100, 200], [10, 30], "c")(400) == pytest.approx(70)
    assert Curve.checked([100, 200], [30, 10], "c")(400) == pytest.approx(10)


def test_a_single_point_is_a_constant() -> None:
    curve = Curve.checked([8], [25], "c")
    assert (curve(1), curve(8), curve(64)) == (25, 25, 25)


def test_a_grid_interpolates_along_both_axes() -> None:
    grid = Grid.checked([1, 9], [100, 1100], [[20, 30], [40, 60]], "g")
    assert grid(1, 100) == pytest.approx(20)
    assert grid(9, 1100) == pytest.approx(60)
    # Halfway on both axes: the rows give 25 and 50 at 600 tokens, halfway between is 37.5.
    assert grid(5, 600) == pytest.approx(37.5)


def test_the_speeds_file_gives_the_step_costs() -> None:
    speeds = speeds_from_json(valid())
    assert speeds.prefill_ms(1, 550) == pytest.approx(275)
    assert speeds.prefill_ms(4, 1000) == pytest.approx(530)
    assert speeds.decode_step_ms(9, 100) == pytest.approx(40)
    assert speeds.handoff_ms(550) == pytest.approx(6.5)
    assert speeds.interference_factor(5000) == 1.0  # left out: the parts' costs add up
    assert speeds.batching == Batching(2048, 128, True, False)  # vLLM's CPU server defaults
    assert speeds.devices_per_server == 1


def test_an_axis_left_out_means_the_cost_does_not_depend_on_it() -> None:
    data = valid()
    data["prefill_ms"] = {"tokens": [100, 1000], "ms": [50, 500]}
    data["decode_step_ms"] = {"batch": [1, 9], "ms": [20, 40]}
    speeds = speeds_from_json(data)
    assert speeds.prefill_ms(1, 1000) == speeds.prefill_ms(8, 1000) == pytest.approx(500)
    assert speeds.decode_step_ms(5, 10) == speeds.decode_step_ms(5, 5000) == pytest.approx(30)


@pytest.mark.parametrize(("change", "where"), [
    (lambda d: d.pop("decode_step_ms"), "decode_step_ms: missing"),
    (lambda d: d["prefill_ms"].update(tokens=[1000, 100]), "prefill_ms.ms[0]: the points' x values"),
    (lambda d: d["prefill_ms"].update(batch=[1], tokens=[100], ms=[[50]]),
     "prefill_ms.tokens: needs at least two prompt lengths"),
    (lambda d: d["prefill_ms"].update(ms=[[50, 500]]), "prefill_ms.ms: 2 rows on the axis but 1"),
    (lambda d: d["decode_step_ms"]["ms"][1].__setitem__(0, True),
     "decode_step_ms.ms[1][0]: expected a number"),
    (lambda d: d["handoff_ms"].update(ms=[-1, 2]), "handoff_ms.ms[0]: must be at least 0"),
    (lambda d: d["handoff_ms"].pop("tokens"), "handoff_ms.tokens: missing"),
    (lambda d: d.update(interference={"tokens": [0], "factor": [0]}), "interference.factor: factors"),
    (lambda d: d.update(batching={"max_num_seqs": 0}), "batching.max_num_seqs: must be at least 1"),
    (lambda d: d.update(batching={"chunked": False}), "batching.chunked: unknown field"),
    (lambda d: d.update(prefil_ms={}), "prefil_ms: unknown field"),
    (lambda d: d.update(devices_per_server=1.5), "devices_per_server: expected a whole number"),
    (lambda d: d.update(neighbour={"factor": 0}), "neighbour.factor: must be above 0"),
    (lambda d: d.update(neighbour={}), "neighbour.factor: missing"),
    (lambda d: d.update(neighbour={"factor": 1.2, "batch": 4}), "neighbour.batch: unknown field"),
])
def test_a_bad_speeds_file_names_the_field(change: Any, where: str) -> None:
    data = valid()
    change(data)
    with pytest.raises(InputError) as raised:
        speeds_from_json(data)
    assert str(raised.value).startswith(where)
