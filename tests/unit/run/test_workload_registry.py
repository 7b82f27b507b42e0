"""One parameters type and one runner per workload, found by the same names; the flow's record as before."""

import pytest

from bbrlab.core.errors import ValidationError
from bbrlab.run import workloads
from bbrlab.scenario.scenario import Flow
from bbrlab.scenario.workloads import PARAMS, IperfParams, RsyncParams, params_of


def test_the_parameters_and_the_runners_are_registered_under_the_same_names():
    assert list(PARAMS) == list(workloads.REGISTRY) == ["iperf3", "rsync"]
    for name, work in workloads.REGISTRY.items():
        assert work.name == PARAMS[name].name == name
        assert workloads.for_flow(Flow("cubic", PARAMS[name]())) is work


def test_a_flow_carries_only_its_workloads_parameters():
    assert Flow("bbr").params == IperfParams(20, 1) and Flow("bbr").workload == "iperf3"
    rsync = Flow("bbr", RsyncParams(file_mb=2))
    assert rsync.workload == "rsync" and rsync.params.file_bytes == 2_000_000 and rsync.params.connections == 1
    assert not hasattr(rsync, "duration_s") and not hasattr(Flow("bbr"), "file_mb")
    with pytest.raises(ValidationError) as e:
        Flow("bbr", 10)  # the duration where the parameters go
    assert e.value.field == "flow.params"


@pytest.mark.parametrize("flow, record", [
    (Flow("bbr", IperfParams(10, 2)), {"cca": "bbr", "duration_s": 10, "streams": 2, "sample_ss_ms": None}),
    (Flow("bbr", RsyncParams(2, 30), sample_ms=10, sampler="bpf", vcpu_trace="on", bottleneck_ms=0),
     {"cca": "bbr", "streams": 1, "sample_ms": 10, "sampler": "bpf", "workload": "rsync", "file_mb": 2,
      "transfer_timeout_s": 30, "vcpu_trace": "on", "bottleneck_ms": 0}),
])
def test_the_record_keeps_its_flat_form_and_key_order(flow, record):
    assert list(flow.to_dict().items()) == list(record.items())
    assert Flow.from_dict(record) == flow


def test_a_record_may_hold_another_workloads_field_only_at_its_fixed_value():
    assert params_of("rsync", streams=1, duration_s=20.0) == RsyncParams()
    assert params_of("iperf3", file_mb=160, transfer_timeout_s=1200) == IperfParams()
    with pytest.raises(ValidationError, match="1 for the rsync workload") as e:
        params_of("rsync", streams=True)
    assert e.value.field == "flow.streams"
    with pytest.raises(TypeError):
        params_of("iperf3", port=5201)
