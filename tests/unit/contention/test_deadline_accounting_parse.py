"""Reading the kernel's count of admitted deadline bandwidth from a sched debug dump (no kernel needed)."""

from bbrlab.contention.accounting import BW_UNIT, parse_sched_debug

DUMP = """\
dl_rq[0]:
  .dl_nr_running                 : 0
  .dl_bw->bw                     : 996147
  .dl_bw->total_bw               : -157288
dl_rq[1]:
  .dl_nr_running                 : 0
  .dl_bw->bw                     : 996147
  .dl_bw->total_bw               : 104856
"""


def test_the_first_root_domain_is_read_in_cpus():
    count = parse_sched_debug(DUMP)
    assert count.total_cpus == -157288 / BW_UNIT and count.drifted_below_zero
    assert round(count.per_cpu_limit, 3) == 0.95


def test_a_dump_without_deadline_counts_gives_none():
    assert parse_sched_debug("cpu#0\n  .nr_running : 1\n") is None
