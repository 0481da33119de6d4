import math
import re

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlflow import specs
from rlflow.specs import BOUNDS, FINITE, NO_CHECK, Field, SpecError, check_mode


def test_from_space_every_kind():
    space = spaces.Dict({
        "box": spaces.Box(-1.0, 1.0, (2, 3), np.float32),
        "disc": spaces.Discrete(4, start=1),
        "multi": spaces.MultiDiscrete([2, 5]),
        "bits": spaces.MultiBinary(6),
        "pair": spaces.Tuple((spaces.Discrete(2), spaces.Box(0, 255, (4,), np.uint8))),
    })
    spec = specs.from_space(space)
    flat = specs.flatten_spec(spec)
    assert list(flat) == ["bits", "box", "disc", "multi", "pair/0", "pair/1"]  # gymnasium sorts Dict keys
    assert flat["box"] == Field((2, 3), np.float32)
    assert flat["disc"] == Field((), np.int64, low=1, high=4)
    assert flat["multi"] == Field((2,), np.int64, low=0, high=(1, 4))  # a bound per element
    assert flat["bits"] == Field((6,), np.int8, low=0, high=1)
    assert flat["pair/1"] == Field((4,), np.uint8)


def test_per_element_bounds():
    """MultiDiscrete([3, 5], start=[1, 0]): each element is checked against its own bounds (by validate,
    fits and a store's append, which then writes nothing); equal bounds collapse to a number; an agent
    axis repeats them; such fields are not given to the compiled checks (check_mode None)."""
    f = specs.from_space(spaces.MultiDiscrete([3, 5], start=[1, 0]))
    assert f.low == (1, 0) and f.high == (3, 4) and specs.check_mode(f) is None
    assert specs.from_space(spaces.MultiDiscrete([3, 3])) == Field((2,), np.int64, low=0, high=2)
    good = np.array([[3, 4], [1, 0]])
    assert specs.fits(f, good, 2) and specs.validate({"a": f}, {"a": good}, (2,))["a"] is good
    for bad, words in ((np.array([[3, 4], [4, 0]]), "<= [3, 4] element by element, got 4 at element (0,)"),
                       (np.array([[3, 4], [1, 5]]), "got 5 at element (1,) (bound 4)"),
                       (np.array([[0, 4], [1, 0]]), ">= [1, 0] element by element, got 0 at element (0,)")):
        assert not specs.fits(f, bad, 2)  # within the bounds of the other element, or of all elements together
        with pytest.raises(SpecError, match=re.escape(words)):
            specs.validate({"a": f}, {"a": bad}, (2,))
    team = specs.add_agent_axis(f, 3)
    assert team.shape == (3, 2) and team.high == (3, 4) * 3
    with pytest.raises(SpecError, match=re.escape("got 5 at element (1, 1)")):  # agent 1, element 1
        specs.validate({"a": team}, {"a": np.array([[[1, 0], [1, 5], [1, 0]]])}, (1,))
    with pytest.raises(SpecError, match="broadcastable to"):
        Field((2,), np.int64, high=[1, 2, 3])
    from rlflow.replay import StepStore

    store = StepStore({"a": f}, capacity=4)
    with pytest.raises(SpecError, match="element"):
        store.append({"a": np.array([[4, 0]])})
    assert store.count.tolist() == [0]


def test_from_space_rejects_unknown():
    with pytest.raises(SpecError, match="Text"):
        specs.from_space(spaces.Text(5))


def test_agent_axis():
    spec = specs.add_agent_axis({"obs": Field((3,), np.float32), "a": (Field((), np.int64),)}, 4)
    flat = specs.flatten_spec(spec)
    assert flat["obs"].shape == (4, 3) and flat["a/0"].shape == (4,)
    with pytest.raises(SpecError):
        specs.add_agent_axis(spec, 0)


def test_flatten_unflatten_round_trip():
    spec = {"a": Field((2,), np.float32), "b": (Field((), np.int64), {"c": Field((), np.bool_)})}
    data = {"a": np.ones((5, 2)), "b": (np.arange(5), {"c": np.zeros(5, bool)})}
    flat = specs.flatten_data(spec, data)
    assert list(flat) == ["a", "b/0", "b/1/c"]
    back = specs.unflatten(spec, flat)
    assert back["b"][1]["c"] is data["b"][1]["c"]


@pytest.mark.parametrize("spec", [
    Field((2,), np.float32),
    {"a": Field((2,), np.float32), "b": (Field((), np.int64), {"c": Field((), np.bool_)})},
    ({"x": (Field((), np.int64), Field((), np.int64)), "y": {}}, Field((1,), np.float32)),
    {"o": {"p": {"q": Field((), np.float32)}}, "r": ()},
])
def test_unflatten_by_a_plan_is_unflatten(spec):
    """The plan built once (StepStore's per-sample unflatten) rebuilds exactly unflatten's nesting: the
    same containers, keys in order, and the very column objects at the leaves."""
    flat = {name: object() for name in specs.flatten_spec(spec)}

    def same(x, y):
        if isinstance(x, dict):
            return type(y) is dict and list(x) == list(y) and all(same(x[k], y[k]) for k in x)
        if isinstance(x, tuple):
            return type(y) is tuple and len(x) == len(y) and all(same(p, q) for p, q in zip(x, y, strict=True))
        return x is y

    assert same(specs.unflatten_by(specs.unflatten_plan(spec), flat), specs.unflatten(spec, flat))


SPEC = {"obs": Field((3,), np.float32), "act": Field((), np.int64, low=0, high=2), "done": Field((), np.bool_)}


def good(n=4):
    return {"obs": np.zeros((n, 3), np.float32), "act": np.zeros(n, np.int64), "done": np.zeros(n, bool)}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("done"), r"missing \['done'\]"),
        (lambda d: d.update(extra=np.zeros(4)), r"unexpected \['extra'\]"),
        (lambda d: d.update(obs=np.zeros((4, 2), np.float32)), r"'obs'.*expected shape \(4, 3\), got \(4, 2\)"),
        (lambda d: d.update(act=np.zeros(4, np.float32)), r"'act'.*expected dtype int64, got float32"),
        (lambda d: d.update(done=np.zeros(4, np.int64)), r"'done'.*expected dtype bool"),
        (lambda d: d["obs"].__setitem__((1, 2), np.nan), r"'obs'.*finite"),
        (lambda d: d["obs"].__setitem__((0, 0), np.inf), r"'obs'.*finite"),
        (lambda d: d["act"].__setitem__(3, 3), r"'act'.*<= 2, got 3"),
        (lambda d: d["act"].__setitem__(0, -1), r"'act'.*>= 0, got -1"),
        (lambda d: d.update(obs=[1, 2]), r"'obs'.*expected shape"),
    ],
)
def test_validate_rejects(mutate, message):
    data = good()
    mutate(data)
    with pytest.raises(SpecError, match=message):
        specs.validate(specs.flatten_spec(SPEC), specs.flatten_data(SPEC, data), (4,))


def test_validate_casts_same_kind_and_allows_nonfinite_when_asked():
    data = good()
    data["obs"] = np.ones((4, 3), np.float64)
    out = specs.validate(specs.flatten_spec(SPEC), specs.flatten_data(SPEC, data), (4,))
    assert out["obs"].dtype == np.float32
    loose = {"x": Field((), np.float32, allow_nonfinite=True)}
    specs.validate(loose, {"x": np.array([np.nan, np.inf])}, (2,))


def test_structure_errors_name_the_field():
    spec = {"a": (Field((), np.float32), Field((), np.float32))}
    with pytest.raises(SpecError, match=r"'a'.*tuple of length 2, got tuple of length 1"):
        specs.flatten_data(spec, {"a": (1.0,)})
    with pytest.raises(SpecError, match=r"'a/0'.*expected an array, got a dict"):
        specs.flatten_data(spec, {"a": ({}, 1.0)})


_FIT_DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.int8, np.uint64, np.bool_]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fits_is_validate_without_conversion(data):
    """``fits`` holds exactly when ``validate`` would accept the array as it is (no cast), for every dtype,
    size (the one-value shortcut and the compiled pass), bound and non-finite value."""
    field_dtype = np.dtype(data.draw(st.sampled_from(_FIT_DTYPES)))
    shape = data.draw(st.sampled_from([(), (1,), (3,), (2, 2)]))
    low = high = None
    if field_dtype.kind in "iu":
        info = np.iinfo(field_dtype)
        low = data.draw(st.one_of(st.none(), st.integers(int(info.min), int(info.max) // 2)))
        high = data.draw(st.one_of(st.none(), st.integers(max(int(info.min), low or 0), int(info.max))))
    field = Field(shape, field_dtype, low=low, high=high, allow_nonfinite=data.draw(st.booleans()))
    n = data.draw(st.integers(0, 3))
    value_dtype = np.dtype(data.draw(st.sampled_from([field_dtype, field_dtype, np.float64, np.int64])))
    size = n * int(np.prod(shape, dtype=np.int64))
    if value_dtype.kind == "f":
        values = data.draw(st.lists(st.sampled_from([0.0, 1.5, -2.0, np.nan, np.inf, -np.inf]), min_size=size,
                                    max_size=size))
    elif value_dtype.kind == "b":
        values = data.draw(st.lists(st.booleans(), min_size=size, max_size=size))
    else:
        info = np.iinfo(value_dtype)
        values = data.draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=size, max_size=size))
    with np.errstate(all="ignore"):
        value = np.array(values, dtype=value_dtype).reshape((n, *shape))
    if data.draw(st.booleans()):
        value = value.reshape((n, *shape))[::-1]  # not contiguous when n > 1
    try:
        with np.errstate(all="ignore"):
            out = specs.validate({"x": field}, {"x": value}, (n,))["x"]
        expected = out is value
    except SpecError:
        expected = False
    assert specs.fits(field, value, n) == expected
    assert not specs.fits(field, value.tolist(), n)  # only an ndarray fits as it is


@pytest.mark.parametrize(("field", "expected"), [
    (Field((2,), np.float32), (FINITE, 0.0, 0.0)),
    (Field((), np.float64, allow_nonfinite=True), (NO_CHECK, 0.0, 0.0)),
    (Field((), np.int64, low=0, high=5), (BOUNDS, 0.0, 5.0)),
    (Field((), np.int8, low=-3), (BOUNDS, -3.0, math.inf)),
    (Field((), np.int64), (NO_CHECK, 0.0, 0.0)),  # no bounds
    (Field((), np.bool_), (NO_CHECK, 0.0, 0.0)),
    (Field((), np.uint64, low=0, high=2**60), None),  # float64 cannot hold the bound exactly
    (Field((), np.int64, high=2**60), None),  # nor with the other bound open
    (Field((), np.int64, low=-(2**60)), None),
])
def test_check_mode_is_fits_value_check_as_numbers(field, expected):
    assert check_mode(field) == expected


@pytest.mark.parametrize(("low", "high", "values", "ok"), [
    (None, 2**60, [2**60, 0], True),
    (None, 2**60, [2**60 + 1, 0], False),  # 2**60 + 1 rounds to 2**60 in float64
    (-(2**60), None, [-(2**60) - 1, 0], False),
    (0, 2**60, [2**60 + 1, 0], False),
])
def test_fits_compares_large_integer_bounds_exactly(low, high, values, ok):
    field = Field((), np.int64, low=low, high=high)
    value = np.array(values, np.int64)
    assert specs.fits(field, value, 2) is ok  # the compiled pass
    assert specs.fits(field, value[:1], 1) is ok  # the one-value shortcut


def test_stack_reach_is_the_largest_stack_minus_one():
    from rlflow.specs import stack_reach

    plain = {"observation": Field((3,), np.float32), "reward": Field((), np.float32)}
    assert stack_reach(plain) == 0
    nested = {"observation": {"pixels": Field((4, 8, 8), np.uint8, stack=4), "ram": Field((2, 5), np.uint8, stack=2)},
              "reward": Field((), np.float32)}
    assert stack_reach(nested) == 3


def test_value_check_is_computed_once_and_is_not_part_of_the_field():
    """A field's ``value_check`` (what hot checks read) is ``check_mode``'s, kept on the field: fields stay
    equal, hashable and picklable with it computed or not."""
    import pickle

    field = Field((2,), np.int64, low=0, high=5)
    assert field.value_check == check_mode(field) == (BOUNDS, 0.0, 5.0)
    assert field.value_check is field.value_check  # computed once
    fresh = Field((2,), np.int64, low=0, high=5)
    assert fresh == field and hash(fresh) == hash(field)
    back = pickle.loads(pickle.dumps(field))
    assert back == field and back.value_check == field.value_check
    assert Field((), np.int64, high=2**60).value_check is None
