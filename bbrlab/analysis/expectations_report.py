"""``bbrlab check``'s two reports of a :class:`~bbrlab.analysis.expectations.CheckReport`: the text it prints
(:func:`text`) and a JUnit XML file for CI (:func:`junit_xml`).

The JUnit report is one ``<testsuite>`` (named after the data folder) with one ``<testcase>`` per expectation per
point judged (``name``: the expectation's name and the point; ``classname``: ``bbrlab.check.<expectation>``), or
one for an expectation that judged no point. A failed point carries ``<failure>``, an undecided one ``<error
type="undecided">`` (CI shows it, and it is not a contradiction); the message is the verdict's evidence, and
every test case's ``<system-out>`` holds the evidence and the expectation in words.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from .expectations import FAIL, PASS, UNDECIDED, CheckReport, Judgement

_MARK = {PASS: "PASS", FAIL: "FAIL", UNDECIDED: "UNDECIDED"}


def text(report: CheckReport) -> str:
    """The report as ``bbrlab check`` prints it: a line per expectation (verdict, name, the expectation in
    words), a line per point (verdict, point, evidence), its notes, and a summary line."""
    lines = [f"bbrlab check {report.path}: {len(report.judgements)} expectation(s) from {report.source}, "
             f"{report.runs} ok runs"]
    for j in report.judgements:
        lines += ["", f"{_MARK[j.verdict]:<9} {j.expectation.label}: {j.expectation.text()}"]
        lines += [f"  {p.verdict:<9} {p.point}: {p.evidence}" for p in j.points]
        lines += [f"  note: {n}" for n in j.notes]
    counts = report.counts()
    lines += ["", f"{_MARK[report.verdict]}: {counts[PASS]} pass, {counts[FAIL]} fail, {counts[UNDECIDED]} undecided"]
    return "\n".join(lines)


def _case(suite: ET.Element, j: Judgement, name: str, verdict: str, evidence: str) -> None:
    case = ET.SubElement(suite, "testcase", name=name, classname=f"bbrlab.check.{j.expectation.label}", time="0")
    if verdict == FAIL:
        ET.SubElement(case, "failure", message=evidence, type="fail").text = evidence
    elif verdict == UNDECIDED:
        ET.SubElement(case, "error", message=evidence, type="undecided").text = evidence
    ET.SubElement(case, "system-out").text = f"{j.expectation.text()}\n{verdict}: {evidence}" + "".join(
        f"\nnote: {n}" for n in j.notes)


def junit_xml(report: CheckReport) -> str:
    """The JUnit XML document of ``report`` (see the module docstring)."""
    suite = ET.Element("testsuite", name=f"bbrlab check {report.path}")
    for j in report.judgements:
        if not j.points:
            _case(suite, j, j.expectation.label, j.verdict, "; ".join(j.notes) or "no point judged")
        for p in j.points:
            _case(suite, j, f"{j.expectation.label} [{p.point}]", p.verdict, p.evidence)
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
    suite.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
    suite.set("skipped", "0")
    suite.set("time", "0")
    root = ET.Element("testsuites", name="bbrlab check", tests=suite.get("tests"), failures=suite.get("failures"),
                      errors=suite.get("errors"))
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
