"""The elastic marker grammar (slurm_elastic.marker): examples, errors, properties."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from slurm_elastic.errors import MarkerError, OutOfReach
from slurm_elastic.marker import (
    KEYS,
    MarkerToken,
    cap_spec,
    check_submission,
    complete_marker,
    format_companion,
    format_marker,
    parse_companion,
    parse_marker,
    parse_token,
    resolve_spec,
)
from slurm_elastic.types import ElasticSpec


@pytest.mark.parametrize(
    ("comment", "expected"),
    [
        ("elastic", MarkerToken()),
        ("elastic/1", MarkerToken(explicit_version=True)),
        ("elastic:min=2,max=8,step=2", MarkerToken(min_nodes=2, max_nodes=8, step=2)),
        ("nightly run; elastic:gpus=4,cost=30 #7", MarkerToken(gpus_per_node=4, cost_s=30)),
        ("elastic/1:max=4", MarkerToken(explicit_version=True, max_nodes=4)),
        ("elastic:min=3,max=3", MarkerToken(min_nodes=3, max_nodes=3)),
        ("elastic:gpus=0,cost=0", MarkerToken(gpus_per_node=0, cost_s=0)),
    ],
)
def test_parse_good_markers(comment: str, expected: MarkerToken) -> None:
    assert parse_marker(comment) == expected


@pytest.mark.parametrize(
    "comment",
    ["", None, "   ", "training run 4", "elasticity study", "Elastic", "non-elastic", "x:elastic"],
)
def test_no_marker(comment: str | None) -> None:
    assert parse_marker(comment) is None
    assert resolve_spec(comment, 2, 8) is None


@pytest.mark.parametrize(
    ("comment", "reason"),
    [
        ("elastic:min=8,max=2", "min=8 is greater than max=2"),
        ("elastic:min=two", "min must be a whole number, got 'two'"),
        ("elastic:min=-1", "min must be a whole number, got '-1'"),
        ("elastic:min=2.5", "min must be a whole number, got '2.5'"),
        ("elastic:min=0", "min must be at least 1, got 0"),
        ("elastic:step=0", "step must be at least 1, got 0"),
        ("elastic:max=1234567", "max is too large (7 digits, at most 6)"),
        ("elastic:size=4", "unknown key 'size' (known: min, max, step, gpus, cost)"),
        ("elastic:min=2,min=3", "duplicate key 'min'"),
        ("elastic:min=1,max=8,step=2", "step=2 does not divide max-min=7 (min=1, max=8)"),
        ("elastic/2", "unknown version '2' (supported: 1)"),
        ("elastic/v1:min=1", "unknown version 'v1' (supported: 1)"),
        ("elastic/", "unknown version '' (supported: 1)"),
        ("elastic:", "empty option list after ':'"),
        ("elastic:min", "option 'min' is not key=value"),
        ("elastic:min=1,", "option '' is not key=value"),
        ("elastic:=3", "option '=3' is not key=value"),
        ("elastic elastic:min=2", "more than one elastic marker in the comment"),
    ],
)
def test_malformed_markers_say_what_is_wrong(comment: str, reason: str) -> None:
    with pytest.raises(MarkerError) as err:
        parse_marker(comment)
    message = str(err.value)
    assert message.endswith(reason)
    assert message.startswith("invalid elastic marker '")
    assert "\n" not in message


def test_error_message_is_one_line_and_bounded() -> None:
    with pytest.raises(MarkerError) as err:
        parse_marker("elastic:min=\x01" + "9" * 200)
    message = str(err.value)
    assert "\x01" not in message and len(message) < 200
    assert "..." in message


def test_resolve_spec_marker_wins_and_job_range_fills_gaps() -> None:
    assert resolve_spec("elastic", 2, 8) == ElasticSpec(min_nodes=2, max_nodes=8)
    # Pinned by the daemon to 3-3: the marker still carries the real range.
    assert resolve_spec("elastic:min=2,max=8,step=2", 3, 3) == ElasticSpec(2, 8, step=2)
    assert resolve_spec("elastic:max=6", 2, None) == ElasticSpec(2, 6)
    assert resolve_spec("elastic", 4, None) == ElasticSpec(4, 4)
    spec = resolve_spec("elastic:gpus=4,cost=30", 1, 4)
    assert spec == ElasticSpec(1, 4, gpus_per_node=4, resize_cost_s=30.0)
    assert spec is not None and spec.allowed_sizes == (1, 2, 3, 4)


def test_resolve_spec_checks_the_combined_range() -> None:
    with pytest.raises(MarkerError, match="step=2 does not divide max-min=5"):
        resolve_spec("elastic:step=2", 3, 8)
    with pytest.raises(MarkerError, match="min=6 is greater than max=4"):
        resolve_spec("elastic:min=6", 2, 4)


def test_check_submission_requires_agreement_with_nodes() -> None:
    assert check_submission("elastic:min=2,max=8", 2, 8) == ElasticSpec(2, 8)
    assert check_submission("elastic:min=2,max=4", None, None) == ElasticSpec(2, 4)
    with pytest.raises(MarkerError, match=r"min=2 disagrees with --nodes=4-8$"):
        check_submission("elastic:min=2", 4, 8)
    with pytest.raises(MarkerError, match=r"max=5 disagrees with --nodes=4$"):
        check_submission("elastic:max=5", 4, None)
    with pytest.raises(MarkerError, match="no node range"):
        check_submission("elastic", None, None)
    assert check_submission("just a comment", None, None) is None


def test_complete_marker_fills_min_and_max_in_place() -> None:
    assert complete_marker("run 3; elastic:step=2 x", 2, 8) == "run 3; elastic:min=2,max=8,step=2 x"
    assert complete_marker("elastic/1", 2, 8) == "elastic/1:min=2,max=8"
    assert complete_marker("elastic:min=2", None, None) == "elastic:min=2,max=2"
    assert complete_marker("elastic:min=2,max=8", 2, 8) == "elastic:min=2,max=8"
    assert complete_marker("plain", 2, 8) == "plain"


def test_companions_are_never_elastic() -> None:
    comment = format_companion(1234)
    assert comment == "slurm-elastic:companion-of=1234"
    assert parse_companion(comment) == 1234
    assert parse_companion(f"grow {comment} elastic") == 1234
    assert parse_marker(f"{comment} elastic:min=1,max=4") is None
    assert resolve_spec(comment, 1, 4) is None
    assert parse_companion("elastic:min=1") is None
    for bad in ("slurm-elastic:companion-of=", "slurm-elastic:companion-of=x", "slurm-elastic:x"):
        with pytest.raises(MarkerError, match="companion token must be"):
            parse_companion(bad)
    with pytest.raises(MarkerError):
        format_companion(0)


# --------------------------------------------------------------------------- properties

sizes = st.integers(min_value=1, max_value=999_999)


@st.composite
def marker_tokens(draw: st.DrawFn) -> MarkerToken:
    low = draw(st.none() | sizes)
    high = draw(st.none() | sizes)
    if low is not None and high is not None and low > high:
        low, high = high, low
    step = draw(st.none() | sizes)
    if step is not None and low is not None and high is not None and (high - low) % step:
        step = None
    return MarkerToken(
        explicit_version=draw(st.booleans()),
        min_nodes=low,
        max_nodes=high,
        step=step,
        gpus_per_node=draw(st.none() | st.integers(0, 999_999)),
        cost_s=draw(st.none() | st.integers(0, 999_999)),
    )


@given(marker_tokens(), st.sampled_from(["", "note ", "a;b; ", "x\t"]))
def test_format_parse_round_trip(marker: MarkerToken, prefix: str) -> None:
    text = format_marker(marker)
    assert parse_token(text) == marker
    assert parse_marker(prefix + text + " tail") == marker


@given(st.integers(1, 64), st.integers(0, 64), st.sampled_from([1, 2, 4]))
def test_spec_round_trip(low: int, extra: int, step: int) -> None:
    spec = ElasticSpec(min_nodes=low, max_nodes=low + extra * step, step=step)
    assert resolve_spec(format_marker(spec), 1, 1) == spec


marker_alphabet = st.sampled_from(
    list("elastic:/=,;0123456789 minaxstepgpuscot-\t\x00é\x85\u2028\x1c")
)


@given(st.text(marker_alphabet, max_size=40) | st.text(max_size=40))
@example("elastic:min=1,max=2,step=0")
@example("elastic/1:" + ",".join(f"{k}=1" for k in KEYS))
def test_garbage_raises_only_marker_error(comment: str) -> None:
    for call in (
        lambda: parse_marker(comment),
        lambda: parse_marker("elastic:" + comment),
        lambda: resolve_spec("elastic:" + comment, 1, None),
        lambda: check_submission(comment, 2, 8),
        lambda: complete_marker(comment, None, None),
    ):
        try:
            call()
        except MarkerError as exc:
            assert len(str(exc).splitlines()) == 1


@pytest.mark.parametrize(
    ("spec", "capacity", "expected"),
    [
        (ElasticSpec(1, 999_999), 4, ElasticSpec(1, 4)),
        (ElasticSpec(2, 999_998, step=3), 7, ElasticSpec(2, 5, step=3)),
        (ElasticSpec(2, 3), 4, ElasticSpec(2, 3)),
        (ElasticSpec(4, 4), 4, ElasticSpec(4, 4)),
    ],
)
def test_cap_spec_bounds_the_range_by_the_capacity(
    spec: ElasticSpec, capacity: int, expected: ElasticSpec
) -> None:
    capped = cap_spec(spec, capacity)
    assert capped == expected
    assert len(capped.allowed_sizes) <= capacity


def test_cap_spec_refuses_a_minimum_out_of_reach() -> None:
    with pytest.raises(OutOfReach, match="min=5 is more than the 4 nodes"):
        cap_spec(ElasticSpec(5, 8), 4)


@given(
    low=st.integers(1, 999_999),
    span=st.integers(0, 999_999),
    step=st.integers(1, 999_999),
    capacity=st.integers(1, 10_000),
)
def test_capped_specs_offer_at_most_capacity_sizes(
    low: int, span: int, step: int, capacity: int
) -> None:
    spec = ElasticSpec(low, low + span // step * step, step=step)
    try:
        capped = cap_spec(spec, capacity)
    except OutOfReach:
        assert low > capacity
        return
    assert capped.min_nodes == low and capped.max_nodes <= capacity
    assert (capped.max_nodes - low) % step == 0
    assert len(capped.allowed_sizes) <= capacity
