#!/usr/bin/python3
"""Checks walrelay's operations kit beyond what promtool checks
(scripts/test.sh runs it after `promtool check rules` and `promtool test
rules`):

1. every alert of deploy/prometheus/walrelay.rules.yml has a severity, a
   summary, a description and a runbook_url naming a section that exists
   (docs/<page>.md#<heading's anchor>);
2. the unit tests (walrelay.rules.test.yml) fire every alert, have a case
   where it does not fire, and a healthy hour on which none fires;
3. the tests notice a change of any alert's threshold, `for:` or range:
   each change is made in turn (mutants) and `promtool test rules` must
   fail on every one;
4. deploy/grafana/walrelay.json is a dashboard of the current schema:
   unique panel ids, every panel and query on the datasource variable;
5. every metric the rules and the dashboard query is documented in
   docs/metrics.md (or is Prometheus's own `up`);
6. docker/compose.yaml runs them: its Prometheus loads the rules (its
   configuration passes `promtool check config` with them), its Grafana
   provisions the dashboard from deploy/.

Usage: scripts/check-ops-kit.py [PROMTOOL]. Needs PyYAML (Debian's
python3-yaml, installed by scripts/install-prometheus.sh).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "prometheus" / "walrelay.rules.yml"
TESTS = REPO / "deploy" / "prometheus" / "walrelay.rules.test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "walrelay.json"
METRICS_DOC = REPO / "docs" / "metrics.md"
DOCKER = REPO / "docker"
#: Grafana 11's dashboard schema (what it writes on save).
SCHEMA_VERSION = 39
SEVERITIES = {"critical", "warning"}
PANEL_TYPES = {"row", "timeseries", "stat", "table", "text", "bargauge", "gauge", "state-timeline"}
#: The healthy hour lasts this long at least.
HEALTHY_MINUTES = 60

errors: list[str] = []


def fail(message: str) -> None:
    errors.append(message)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings."""
    found = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            text = m.group(1).strip().lower()
            text = re.sub(r"[^\w\- ]", "", text)
            found.add(text.replace(" ", "-"))
    return found


def alerts_of(rules: dict) -> list[dict]:
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


def check_rules(alerts: list[dict]) -> None:
    names = [a["alert"] for a in alerts]
    if len(names) != len(set(names)):
        fail(f"rules: an alert name is used twice: {sorted(names)}")
    for a in alerts:
        name = a["alert"]
        severity = a.get("labels", {}).get("severity")
        if severity not in SEVERITIES:
            fail(f"{name}: severity {severity!r} is none of {sorted(SEVERITIES)}")
        notes = a.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            if not notes.get(key):
                fail(f"{name}: no {key} annotation")
        url = notes.get("runbook_url", "")
        m = re.fullmatch(r"(docs/[\w.-]+\.md)#([\w-]+)", url)
        if not m:
            fail(f"{name}: runbook_url {url!r} is not docs/<page>.md#<section>")
            continue
        page = REPO / m.group(1)
        if not page.is_file():
            fail(f"{name}: runbook_url names {m.group(1)}, which does not exist")
        elif m.group(2) not in anchors(page):
            fail(f"{name}: runbook_url names #{m.group(2)}, no heading of {m.group(1)}")


def minutes(duration: str) -> float:
    m = re.fullmatch(r"(\d+)([smh])", str(duration))
    if not m:
        raise ValueError(f"unexpected duration {duration!r}")
    return int(m.group(1)) * {"s": 1 / 60, "m": 1, "h": 60}[m.group(2)]


def check_tests(alerts: list[dict], tests: dict) -> None:
    names = {a["alert"] for a in alerts}
    fired, quiet, healthy = set(), set(), set()
    for group in tests["tests"]:
        is_healthy = str(group.get("name", "")).startswith("healthy")
        for case in group.get("alert_rule_test", []):
            name = case["alertname"]
            if name not in names:
                fail(f"tests: {group.get('name')} tests {name}, which the rules file does not have")
            if case.get("exp_alerts"):
                fired.add(name)
            else:
                quiet.add(name)
                if is_healthy and minutes(case["eval_time"]) >= HEALTHY_MINUTES:
                    healthy.add(name)
    for name in sorted(names - fired):
        fail(f"tests: no unit test fires {name}")
    for name in sorted(names - quiet):
        fail(f"tests: no unit test where {name} does not fire")
    for name in sorted(names - healthy):
        fail(f"tests: the healthy hour does not check {name} (a case at {HEALTHY_MINUTES}m or later)")


def mutants(alerts: list[dict]):
    """(description, alert index, mutated rule) for each threshold, `for:`
    and range of each alert."""
    for i, a in enumerate(alerts):
        expr = a["expr"]
        for m in re.finditer(r"(==|!=|>=|<=|>|<)\s*(-?\d+(?:\.\d+)?)", expr):
            value = float(m.group(2))
            if value == int(value) and abs(value) <= 100:
                changed = [int(value) - 1, int(value) + 1]
            else:
                changed = [repr(value * 0.9), repr(value * 1.1)]
            for v in changed:
                new = expr[: m.start(2)] + str(v) + expr[m.end(2) :]
                yield f"{a['alert']}: threshold {m.group(2)} -> {v}", i, {**a, "expr": new}
        for m in re.finditer(r"\[(\d+[mh])\]", expr):
            n = int(minutes(m.group(1)))
            for v in (n - 1, n + 1):
                new = expr[: m.start(1)] + f"{v}m" + expr[m.end(1) :]
                yield f"{a['alert']}: range [{m.group(1)}] -> [{v}m]", i, {**a, "expr": new}
        wait = int(minutes(a.get("for", "0m")))
        for v in (wait - 1, wait + 1):
            if v >= 0:
                yield f"{a['alert']}: for {wait}m -> {v}m", i, {**a, "for": f"{v}m"}


def check_mutants(promtool: str, rules: dict, tests: dict, alerts: list[dict]) -> int:
    """Runs each mutant against the test groups that name its alert (the
    others cannot notice it), two at a time."""
    found = list(mutants(alerts))
    with tempfile.TemporaryDirectory() as tmp:

        def run(n: int, what: str, index: int, rule: dict) -> str | None:
            mutated = json.loads(json.dumps(rules))
            k = 0
            for g in mutated["groups"]:
                for j, r in enumerate(g["rules"]):
                    if "alert" in r:
                        if k == index:
                            g["rules"][j] = rule
                        k += 1
            name = rule["alert"]
            groups = [
                g for g in tests["tests"] if any(c["alertname"] == name for c in g.get("alert_rule_test", []))
            ]
            rules_file = Path(tmp) / f"mutant{n}.rules.yml"
            rules_file.write_text(yaml.safe_dump(mutated, sort_keys=False), encoding="utf-8")
            test_file = Path(tmp) / f"mutant{n}.test.yml"
            narrowed = {**tests, "rule_files": [rules_file.name], "tests": groups}
            test_file.write_text(yaml.safe_dump(narrowed, sort_keys=False), encoding="utf-8")
            done = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True)
            return what if done.returncode == 0 else None

        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(lambda x: run(x[0], *x[1]), enumerate(found)))
    for what in results:
        if what is not None:
            fail(f"tests: a changed rule passes the unit tests ({what})")
    return len(found)


def documented_metrics() -> set[str]:
    text = METRICS_DOC.read_text(encoding="utf-8")
    return set(re.findall(r"^\| `(walrelay_[a-z0-9_]+)` \|", text, re.MULTILINE))


def metric_names(expr: str) -> set[str]:
    names = set(re.findall(r"\b(walrelay_[a-z0-9_]+)", expr))
    if re.search(r"\bup\s*\{", expr):
        names.add("up")
    return names


def documented(name: str, docs: set[str]) -> bool:
    if name == "up" or name in docs:
        return True
    for suffix in ("_bucket", "_count", "_sum"):
        if name.endswith(suffix) and name[: -len(suffix)] in docs:
            return True
    return False


def panels_of(dashboard: dict) -> list[dict]:
    out = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def check_dashboard(docs: set[str]) -> int:
    try:
        d = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    except ValueError as e:
        fail(f"dashboard: not JSON: {e}")
        return 0
    if d.get("schemaVersion") != SCHEMA_VERSION:
        fail(f"dashboard: schemaVersion {d.get('schemaVersion')}, not {SCHEMA_VERSION}")
    for key in ("uid", "title"):
        if not d.get(key):
            fail(f"dashboard: no {key}")
    variables = d.get("templating", {}).get("list", [])
    ds = [v for v in variables if v.get("type") == "datasource"]
    if len(ds) != 1 or ds[0].get("query") != "prometheus":
        fail("dashboard: needs one datasource variable of type prometheus")
        return 0
    ref = {"type": "prometheus", "uid": "${%s}" % ds[0]["name"]}
    ids, queries = [], 0
    for p in panels_of(d):
        title = p.get("title", "?")
        ids.append(p.get("id"))
        if p.get("type") not in PANEL_TYPES:
            fail(f"dashboard: panel {title!r} has type {p.get('type')!r}")
        if not isinstance(p.get("gridPos"), dict):
            fail(f"dashboard: panel {title!r} has no gridPos")
        if p.get("type") == "row":
            continue
        if p.get("datasource") != ref:
            fail(f"dashboard: panel {title!r} is not on the datasource variable ({p.get('datasource')})")
        targets = p.get("targets", [])
        if not targets:
            fail(f"dashboard: panel {title!r} has no query")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or None in refs:
            fail(f"dashboard: panel {title!r} has missing or repeated refIds")
        for t in targets:
            queries += 1
            if t.get("datasource") != ref:
                fail(f"dashboard: a query of {title!r} is not on the datasource variable")
            for name in sorted(metric_names(t.get("expr", ""))):
                if not documented(name, docs):
                    fail(f"dashboard: {title!r} queries {name}, which docs/metrics.md does not document")
            if not metric_names(t.get("expr", "")):
                fail(f"dashboard: a query of {title!r} names no walrelay metric: {t.get('expr')!r}")
    if None in ids or len(ids) != len(set(ids)):
        fail(f"dashboard: panel ids are missing or repeated: {ids}")
    return queries


def mounts(service: dict) -> dict[str, Path]:
    """A compose service's read-only bind mounts: container path -> host path."""
    out = {}
    for volume in service.get("volumes", []):
        host, container, *_ = volume.split(":")
        out[container] = (DOCKER / host).resolve()
    return out


def check_compose(promtool: str) -> None:
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text(encoding="utf-8"))["services"]
    prometheus, grafana = services.get("prometheus"), services.get("grafana")
    if not prometheus or not grafana:
        fail("compose: no prometheus or no grafana service")
        return
    files = mounts(prometheus)
    config_path = next((a.split("=", 1)[1] for a in prometheus.get("command", []) if a.startswith("--config.file=")), "")
    config = files.get(config_path)
    if config is None:
        fail(f"compose: prometheus's --config.file {config_path!r} is not mounted")
        return
    rule_files = yaml.safe_load(config.read_text(encoding="utf-8")).get("rule_files", [])
    rules_in_container = [str(Path(config_path).parent / r) for r in rule_files]
    if [files.get(r) for r in rules_in_container] != [RULES]:
        fail(f"compose: prometheus's rule_files {rules_in_container} are not {RULES.relative_to(REPO)}")
    with tempfile.TemporaryDirectory() as tmp:
        for container, host in files.items():
            if Path(container).parent == Path(config_path).parent:
                (Path(tmp) / Path(container).name).write_bytes(host.read_bytes())
        run = subprocess.run([promtool, "check", "config", str(Path(tmp) / Path(config_path).name)], capture_output=True, text=True)
        if run.returncode != 0:
            fail(f"compose: promtool check config fails on {config.relative_to(REPO)}: {run.stdout}{run.stderr}")
    provisioned = mounts(grafana)
    providers = [
        p
        for c, h in provisioned.items()
        if c.startswith("/etc/grafana/provisioning/dashboards/")
        for p in yaml.safe_load(h.read_text(encoding="utf-8")).get("providers", [])
    ]
    paths = {p["options"]["path"] for p in providers}
    if not any(provisioned.get(f"{path}/{DASHBOARD.name}") == DASHBOARD for path in paths):
        fail(f"compose: grafana does not provision {DASHBOARD.relative_to(REPO)} from a provider's path {paths}")
    if not any(c.startswith("/etc/grafana/provisioning/datasources/") for c in provisioned):
        fail("compose: grafana has no provisioned data source")


def main() -> None:
    promtool = sys.argv[1] if len(sys.argv) > 1 else "promtool"
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    tests = yaml.safe_load(TESTS.read_text(encoding="utf-8"))
    alerts = alerts_of(rules)
    docs = documented_metrics()
    check_rules(alerts)
    check_tests(alerts, tests)
    for a in alerts:
        for name in sorted(metric_names(a["expr"])):
            if not documented(name, docs):
                fail(f"{a['alert']}: uses {name}, which docs/metrics.md does not document")
    queries = check_dashboard(docs)
    check_compose(promtool)
    tried = check_mutants(promtool, rules, tests, alerts)
    if errors:
        print("\n".join(f"check-ops-kit: {e}" for e in errors), file=sys.stderr)
        sys.exit(1)
    print(f"ops kit: {len(alerts)} alerts, {tried} changed rules all caught by the unit tests, {queries} dashboard queries")


if __name__ == "__main__":
    main()
