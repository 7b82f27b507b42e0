"""Property: any YAML document either loads into a valid campaign spec or raises a ValidationError
naming the field; never another exception (hypothesis generates the documents)."""

from __future__ import annotations

import dataclasses
import math

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bbrlab.campaign.dimensions import BY_KEY
from bbrlab.campaign.spec import CampaignSpec, spec_from_yaml
from bbrlab.campaign.spec_combinations import MAX_RUNS
from bbrlab.core.errors import ValidationError, key_name

#: The spec's keys: its fields (``adaptive`` comes from ``repetitions: {min, max, precision}``) + the older form of
#: sample_ms.
KEYS = [f.name for f in dataclasses.fields(CampaignSpec) if f.name != "adaptive"] + ["sample_ss_ms"]
#: Field names a ValidationError may give besides a key (or "key[i]", "key[i] with ...").
OTHER_FIELDS = {"spec", "grid x repetitions", "plan"}
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(["cubic", "bbr", "bbr2b", "local", "lab.yaml", "../x.yaml", "blocked-random", "forward"]),
)
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=8), inner, max_size=3), max_leaves=12)
numbers = st.one_of(st.integers(min_value=-5, max_value=2000), st.floats(min_value=-1, max_value=1e5),
                    st.floats(allow_nan=True, allow_infinity=True))
plausible = {
    "name": st.sampled_from(["demo", "a.b-c_1", "x" * 65, "", "../etc", 3]),
    "testbed": st.sampled_from([None, "local", "harden", "lab.yaml", "labs/lab1.yaml", "/abs/lab.yml", "Bad Name"]),
    "ccas": st.lists(st.sampled_from(["cubic", "bbr", "bbr2b", "BBR", "x; id", ""]), max_size=3),
    "timeslices_ms": st.lists(numbers, max_size=3),
    "cpu_shares_pct": st.lists(numbers, max_size=3),
    "rtts_ms": st.lists(numbers, max_size=3),
    "rates_mbit": st.lists(numbers, max_size=3),
    "buffers_bdp": st.lists(numbers, max_size=3),
    "losses_pct": st.lists(numbers, max_size=3),
    "streams": st.lists(st.integers(min_value=-1, max_value=200), max_size=3),
    "repetitions": st.one_of(st.integers(min_value=-1, max_value=2000), st.fixed_dictionaries(
        {"min": st.integers(min_value=-1, max_value=40), "max": st.integers(min_value=-1, max_value=2000)},
        optional={"precision": numbers, "block": st.integers()})),
    "search": st.one_of(anything, st.fixed_dictionaries({"target": numbers}, optional={
        k: numbers for k in ("low", "high", "step", "resolution", "confidence")} | {
        k: st.integers(min_value=-1, max_value=2000) for k in ("min", "block", "max")})),
    "duration_s": numbers,
    "sample_ss_ms": st.one_of(st.none(), st.integers(min_value=-1, max_value=20_000)),
    "sample_ms": st.one_of(st.none(), st.integers(min_value=-1, max_value=20_000)),
    "sampler": st.sampled_from(["bpf", "netlink", "ss", "tcpdump", None]),
    "vcpu_trace": st.sampled_from(["auto", "on", "off", "yes", 1, None]),
    "bottleneck_ms": st.sampled_from(["auto", 0, 5, 1000, 1001, -1, "often", True, None]),
    "workloads": st.lists(st.sampled_from(["iperf3", "rsync", "scp", ""]), max_size=3),
    "kernels": st.lists(st.sampled_from(["debian-6.1", "debian-5.10", "debian-6.12", "linux-9", "k/bzdir",
                                         "x.deb", "/abs/kernel", ""]), max_size=3),
    "file_mb": numbers,
    "transfer_timeout_s": numbers,
    "order": st.sampled_from(["blocked-random", "sequential", "random", "shuffled"]),
    "seed": st.integers(min_value=-1, max_value=2**64),
    "max_attempts": st.integers(min_value=-1, max_value=12),
    "delay_split": st.sampled_from(["symmetric", "forward", "both"]),
    "blocks": st.one_of(st.integers(min_value=-1, max_value=7), st.sampled_from([True, "2", 1.5, None])),
    "block_reboot": st.sampled_from(["sender", "sender+emulator", "emulator", "", None, 1]),
    "host_guard": st.one_of(st.sampled_from(["off", "on", False, None, 25]), st.fixed_dictionaries({}, optional={
        "max_other_busy_pct": st.sampled_from([-1, 0, 0.5, 25, 100, 101, "25", True]), "x": scalars})),
    "description": st.one_of(st.text(max_size=20), st.integers()),
    "queues": st.lists(st.sampled_from(["bbrlab", "authors", "fifo", ""]), max_size=3),
    "contention_models": st.lists(st.sampled_from(["deadline", "cfs-quota", "cfs-burst", "credit", "competing-load",
                                                   "none", "steal"]), max_size=3),
    "cfs_periods_ms": st.lists(st.sampled_from([0.5, 1, 10, 100, 1000, 5000]), max_size=3),
    "cfs_bursts_ms": st.lists(st.sampled_from([0, 0.5, 1, 5, 50, 2000, "x"]), max_size=3),
    "credit_shares_pct": st.lists(st.sampled_from([0, 0.5, 5, 25, 100, 150]), max_size=3),
    "credits_s": st.lists(st.sampled_from([-1, 0, 0.1, 10, 3600, 4000, None]), max_size=3),
    "emulator_offloads": st.sampled_from(["off", "on", True, False, "maybe", None, 1]),
    "sender_qdiscs": st.lists(st.sampled_from(["default", "fq", "fq_codel", "", None, 3]), max_size=3),
    "cca_params": st.one_of(anything, st.dictionaries(st.sampled_from(["bbr2b", "cubic", "X", ""]), st.one_of(
        anything, st.dictionaries(st.sampled_from(["deficit_gain", "beta", "Bad", ""]), st.lists(numbers, max_size=3),
                                  max_size=2)), max_size=2)),
    "sender_sysctls": st.one_of(anything, st.dictionaries(st.sampled_from([
        "net.ipv4.tcp_limit_output_bytes", "net.ipv4.tcp_pacing_ss_ratio", "net.core.default_qdisc", "x"]),
        st.lists(numbers, max_size=3), max_size=2)),
    "flows": st.one_of(anything, st.lists(st.fixed_dictionaries({"cca": st.sampled_from(["cubic", "bbr", "X"])}, optional={
        "origin": st.sampled_from(["sender", "competitor", "receiver", None]), "start_s": numbers,
        "duration_s": numbers, "streams": st.integers(min_value=-1, max_value=200), "x": scalars}), max_size=3)),
}
valid = st.fixed_dictionaries({
    "name": st.just("p"),
    "ccas": st.lists(st.sampled_from(["cubic", "bbr", "bbr2b"]), min_size=1, max_size=3, unique=True),
    "timeslices_ms": st.lists(st.floats(min_value=0.01, max_value=100), min_size=1, max_size=3, unique=True),
    "cpu_shares_pct": st.lists(st.floats(min_value=0.5, max_value=100), min_size=1, max_size=3, unique=True),
    "rtts_ms": st.lists(st.floats(min_value=0, max_value=2000), min_size=1, max_size=2, unique=True),
    "rates_mbit": st.lists(st.floats(min_value=0.001, max_value=50_000), min_size=1, max_size=2, unique=True),
}, optional={
    "buffers_bdp": st.lists(st.floats(min_value=0.01, max_value=20), min_size=1, max_size=2, unique=True),
    "losses_pct": st.lists(st.floats(min_value=0, max_value=60), min_size=1, max_size=2, unique=True),
    "repetitions": st.one_of(st.integers(min_value=1, max_value=3), st.fixed_dictionaries(
        {"min": st.just(5), "max": st.integers(min_value=5, max_value=6),
         "precision": st.floats(min_value=0.001, max_value=0.5)})),
    "workloads": st.lists(st.sampled_from(["iperf3", "rsync"]), min_size=1, max_size=2, unique=True),
    "queues": st.lists(st.sampled_from(["bbrlab", "authors"]), min_size=1, max_size=2, unique=True),
    "emulator_offloads": st.sampled_from(["off", "on"]),
    "sender_qdiscs": st.lists(st.sampled_from(["default", "fq"]), min_size=1, max_size=2, unique=True),
    "cca_params": st.fixed_dictionaries({"bbr2b": st.fixed_dictionaries({"deficit_gain": st.lists(
        st.integers(min_value=0, max_value=1023), min_size=1, max_size=2, unique=True)})}),
    "sender_sysctls": st.fixed_dictionaries({"net.ipv4.tcp_pacing_ss_ratio": st.lists(
        st.integers(min_value=0, max_value=1000), min_size=1, max_size=2, unique=True)}),
})


def _listed(key: str) -> st.SearchStrategy:
    """A list for a dimension that :data:`plausible` does not name yet (from its table entry), else anything."""
    d = BY_KEY.get(key)
    if d is None:
        return anything
    return st.lists(st.sampled_from(["", "x", None]) if d.type is str else numbers, max_size=3)


@st.composite
def documents(draw) -> str:
    """YAML text: a plausible or valid spec with some values replaced, or any document, maybe a key twice."""
    kind = draw(st.sampled_from(["valid", "plausible", "anything", "text"]))
    if kind == "text":
        return draw(st.text(max_size=200))
    if kind == "anything":
        return yaml.safe_dump(draw(anything))
    doc = draw(valid) if kind == "valid" else {
        k: draw(plausible[k] if k in plausible else _listed(k)) for k in draw(st.lists(st.sampled_from(KEYS), unique=True, max_size=len(KEYS)))}
    for key in draw(st.lists(st.sampled_from([*KEYS, "typo"]), max_size=2)):
        doc[key] = draw(anything | plausible.get(key, anything))
    text = yaml.safe_dump(doc, sort_keys=False)
    if draw(st.booleans()) and doc:
        key = draw(st.sampled_from(sorted(doc)))
        text += yaml.safe_dump({key: doc[key]})  # the same key again
    return text


def _check(text: str) -> None:
    try:
        spec = spec_from_yaml(text, "<hypothesis>")
    except ValidationError as e:
        assert isinstance(e.field, str) and e.field, e
        head = e.field.split("[", 1)[0].split(" with ", 1)[0].split(".", 1)[0]
        doc_keys = set()
        try:
            loaded = yaml.safe_load(text)
            doc_keys = {key_name(k) for k in loaded} if isinstance(loaded, dict) else set()
        except (yaml.YAMLError, RecursionError):
            pass
        assert e.field in doc_keys or head in KEYS or head in OTHER_FIELDS, e
        assert e.allowed, e
        return
    assert isinstance(spec, CampaignSpec)
    assert CampaignSpec.from_dict(spec.to_dict()) == spec  # what is kept in spec.yaml loads back the same
    assert 1 <= spec.runs <= MAX_RUNS
    grid = spec.grid()
    assert len(grid) * spec.repetitions == spec.runs
    assert all(math.isfinite(s.link.bdp_bytes) and s.contention.period_ns > 0 for s in grid)


@SETTINGS
@given(documents())
@example("name: [unclosed\n")
@example("name: a\nname: b\n")
@example("? [a, b]\n: 1\n")
@example("[" * 2000)
@example("? ''\n: null\n")
@example("'[': null\n")
@example("name: t\nccas: [cubic]\ntimeslices_ms: [1]\ncpu_shares_pct: [1.0e-300]\nrtts_ms: [1]\nrates_mbit: [1]\n")
def test_any_document_loads_into_a_valid_spec_or_names_the_field(text):
    _check(text)


@SETTINGS
@given(valid)
def test_plausible_specs_load_or_name_a_combination(doc):
    _check(yaml.safe_dump(doc))
