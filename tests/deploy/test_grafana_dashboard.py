"""The Grafana files under deploy/grafana/ fit together and fit what gpuflame pushes.

Nothing here starts Grafana. The checks read the files the way Grafana would
and catch the mistakes that leave a panel empty. A panel can ask for a profile
type that is never pushed, or use a ``$variable`` that no one defined. A
dashboard can point at a data source uid that provisioning never created.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuflame.model import sample_types
from tests.helpers.paths import REPO

ROOT = REPO
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
DASHBOARD = DASHBOARDS / "gpuflame-gpu-memory.json"
DATASOURCES_YAML = GRAFANA / "provisioning" / "datasources" / "pyroscope.yaml"
PROVIDERS_YAML = GRAFANA / "provisioning" / "dashboards" / "gpuflame.yaml"
COMPOSE = GRAFANA / "docker-compose.yml"

PYROSCOPE_TYPE = "grafana-pyroscope-datasource"
# README's "Continuous profiling into Pyroscope": the series labels gpuflame pushes.
SERIES_LABELS = {"service_name", "namespace", "pod", "container", "node", "gpu", "pid"}
# The variables the dashboard must offer (issue 5, item 4, plus service_name).
FILTER_VARIABLES = ("service_name", "namespace", "pod", "container", "node", "gpu")

# $name, ${name}, ${name:format}, [[name]] (Grafana's old syntax)
VARIABLE_REF = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]")


def pushed_profile_type_ids() -> set[str]:
    """Pyroscope's ids for the profiles gpuflame pushes.

    Pyroscope names a profile type ``name:sample_type:sample_unit:period_type:period_unit``.
    README fixes the name to ``gpu_memory``. The period type is ``space/bytes`` for
    every sample type, as in Go heap profiles (``memory:inuse_objects:count:space:bytes``),
    which gives ``gpu_memory:inuse_space:bytes:space:bytes``. The name and period type
    are taken from the Pyroscope client when it is there, so the dashboard follows
    what is really pushed.
    """
    try:
        from gpuflame.ship.pyroscope import PERIOD_TYPE, PROFILE_NAME
    except ImportError:  # no client: README's convention
        name, period = "gpu_memory", ("space", "bytes")
    else:
        name, period = PROFILE_NAME, (PERIOD_TYPE.type, PERIOD_TYPE.unit)
    return {f"{name}:{st.type}:{st.unit}:{period[0]}:{period[1]}" for st in sample_types.ALL}


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, with the panels inside rows (collapsed or not)."""
    out: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in all_panels(dashboard) if p.get("type") not in ("row", "text")]


def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def referenced_variables(obj: Any) -> set[str]:
    text = json.dumps(obj)
    names = {next(g for g in m.groups() if g) for m in VARIABLE_REF.finditer(text)}
    return {n for n in names if not n.startswith("__")}  # $__all, $__interval ... are Grafana's own


def provisioned_datasource() -> dict[str, Any]:
    config = yaml.safe_load(DATASOURCES_YAML.read_text(encoding="utf-8"))
    pyroscopes = [d for d in config["datasources"] if d["type"] == PYROSCOPE_TYPE]
    assert len(pyroscopes) == 1
    return pyroscopes[0]


def resolve_datasource_uid(dashboard: dict[str, Any], ref: Any) -> str:
    """The uid a panel's datasource reference ends up as when the dashboard loads."""
    assert isinstance(ref, dict), f"datasource given by name, not by {{type, uid}}: {ref!r}"
    assert ref.get("type") == PYROSCOPE_TYPE, ref
    uid = ref["uid"]
    m = VARIABLE_REF.fullmatch(uid)
    if m:
        var = variables(dashboard)[next(g for g in m.groups() if g)]
        assert var["type"] == "datasource" and var["query"] == PYROSCOPE_TYPE
        return var["current"]["value"]
    return uid


def parse_label_selector(selector: str) -> list[tuple[str, str, str]]:
    """``{a="x", b=~`y`}`` as (label, operator, value) triples; fails on anything else."""
    assert selector.startswith("{") and selector.endswith("}"), selector
    body = selector[1:-1].strip()
    matcher = re.compile(r'\s*(\w+)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|`[^`]*`)\s*(,|$)')
    out, pos = [], 0
    while pos < len(body):
        m = matcher.match(body, pos)
        assert m, f"cannot parse label selector at {body[pos:]!r}"
        out.append((m.group(1), m.group(2), m.group(3)[1:-1]))
        pos = m.end()
    return out


# -- the dashboard file itself ---------------------------------------------------------


def test_dashboards_are_valid_json_with_unique_uids() -> None:
    files = sorted(DASHBOARDS.glob("*.json"))
    assert DASHBOARD in files
    uids = [load_dashboard(f)["uid"] for f in files]
    assert all(isinstance(u, str) and 0 < len(u) <= 40 for u in uids)
    assert len(uids) == len(set(uids))


def test_dashboard_header() -> None:
    dash = load_dashboard()
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    assert dash["title"]
    assert dash.get("id") is None  # an id is per-Grafana database; provisioning assigns one
    ids = [p["id"] for p in all_panels(dash)]
    assert len(ids) == len(set(ids))
    # The AKS guide's advice: auto-refresh collapses an expanded flame graph.
    assert dash.get("refresh") in ("", None, False)


# -- profile types ---------------------------------------------------------------------


def test_the_id_mapping_matches_design() -> None:
    """The ids the client makes are the ones README promises Grafana will list."""
    ids = pushed_profile_type_ids()
    assert "gpu_memory:inuse_space:bytes:space:bytes" in ids
    assert "gpu_memory:peak_space:bytes:space:bytes" in ids
    assert "gpu_memory:alloc_space:bytes:space:bytes" in ids
    assert len(ids) == len(sample_types.ALL)


def test_every_query_uses_a_profile_type_gpuflame_pushes() -> None:
    dash = load_dashboard()
    pushed = pushed_profile_type_ids()
    targets = [t for p in query_panels(dash) for t in p["targets"]]
    assert targets
    for target in targets:
        assert target["profileTypeId"] in pushed, target
    for var in variables(dash).values():
        if var["type"] == "query":
            assert var["query"]["profileTypeId"] in pushed, var["name"]


def test_flame_graphs_for_peak_inuse_and_alloc() -> None:
    dash = load_dashboard()
    flames = [p for p in query_panels(dash) if p["type"] == "flamegraph"]
    shown = set()
    for panel in flames:
        assert panel["title"]
        assert len(panel["targets"]) == 1
        target = panel["targets"][0]
        assert target["queryType"] == "profile"
        shown.add(target["profileTypeId"])
    assert shown == {f"gpu_memory:{t}:bytes:space:bytes" for t in ("peak_space", "inuse_space", "alloc_space")}
    # a profile query anywhere else would need a flame graph to be read
    for panel in query_panels(dash):
        if any(t.get("queryType") == "profile" for t in panel["targets"]):
            assert panel["type"] == "flamegraph", panel["title"]


def test_a_time_series_of_memory_in_use_per_pod() -> None:
    dash = load_dashboard()
    series = [p for p in query_panels(dash) if p["type"] == "timeseries"]
    wanted = [
        p
        for p in series
        for t in p["targets"]
        if t["queryType"] == "metrics"
        and t["profileTypeId"] == "gpu_memory:inuse_space:bytes:space:bytes"
        and t["groupBy"] == ["pod"]
    ]
    assert len(wanted) == 1
    assert wanted[0]["fieldConfig"]["defaults"]["unit"] == "bytes"


def test_query_types_are_ones_pyroscope_knows() -> None:
    for panel in query_panels(load_dashboard()):
        for target in panel["targets"]:
            assert target["queryType"] in ("profile", "metrics", "both")
            assert isinstance(target["groupBy"], list)
            assert target["refId"]


# -- variables -------------------------------------------------------------------------


def test_filter_variables_are_pyroscope_label_values_with_all() -> None:
    dash = load_dashboard()
    defined = variables(dash)
    for name in FILTER_VARIABLES:
        var = defined[name]
        assert var["type"] == "query"
        assert var["multi"] is True and var["includeAll"] is True
        # All must match every value, and also a series that lacks the label (a laptop run).
        assert var["allValue"] == ".*"
        assert var["query"]["type"] == "labelValue"
        assert var["query"]["labelName"] == name
        assert var["refresh"] in (1, 2)  # on load / on time range change, not "never"
        resolve_datasource_uid(dash, var["datasource"])


def test_every_variable_used_is_defined_and_every_defined_one_is_used() -> None:
    dash = load_dashboard()
    defined = set(variables(dash))
    used_in_panels = referenced_variables(dash["panels"])
    used_in_variables = referenced_variables(dash["templating"])
    assert used_in_panels | used_in_variables <= defined
    assert defined <= used_in_panels


def test_every_query_filters_on_every_label_variable() -> None:
    for panel in query_panels(load_dashboard()):
        for target in panel["targets"]:
            matchers = parse_label_selector(target["labelSelector"])
            by_label = {label: (op, value) for label, op, value in matchers}
            assert set(by_label) <= SERIES_LABELS
            for name in FILTER_VARIABLES:
                op, value = by_label[name]
                # A multi-value variable becomes (a|b) only with the regex format, under =~.
                assert op == "=~", (panel["title"], name)
                assert value == f"${{{name}:regex}}", (panel["title"], name)


def test_label_selector_parser_rejects_junk() -> None:
    assert parse_label_selector('{a="x", b=~`y.*`}') == [("a", "=", "x"), ("b", "=~", "y.*")]
    with pytest.raises(AssertionError):
        parse_label_selector("{a=x}")


# -- provisioning ----------------------------------------------------------------------


def test_datasource_provisioning_parses() -> None:
    config = yaml.safe_load(DATASOURCES_YAML.read_text(encoding="utf-8"))
    assert config["apiVersion"] == 1
    ds = provisioned_datasource()
    assert ds["uid"] and ds["name"]
    assert ds["access"] == "proxy"
    # The URL comes from the environment; the compose file supplies the default.
    assert re.fullmatch(r"\$\{?GPUFLAME_PYROSCOPE_URL\}?", ds["url"])
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    env = compose["services"]["grafana"]["environment"]
    assert env["GPUFLAME_PYROSCOPE_URL"] == "${GPUFLAME_PYROSCOPE_URL:-http://pyroscope:4040}"


def test_dashboard_provider_parses_and_points_at_the_mounted_folder() -> None:
    config = yaml.safe_load(PROVIDERS_YAML.read_text(encoding="utf-8"))
    assert config["apiVersion"] == 1
    (provider,) = config["providers"]
    assert provider["type"] == "file"
    path = provider["options"]["path"]
    # The compose file mounts deploy/grafana/dashboards at that path, and the
    # provisioning folders where Grafana looks for them.
    mounts = {}
    for volume in yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]["grafana"]["volumes"]:
        source, target = volume.split(":")[:2]
        mounts[target] = (COMPOSE.parent / source).resolve()
    assert mounts[path] == DASHBOARDS.resolve()
    assert mounts["/etc/grafana/provisioning/datasources"] == DATASOURCES_YAML.parent.resolve()
    assert mounts["/etc/grafana/provisioning/dashboards"] == PROVIDERS_YAML.parent.resolve()


def test_dashboard_uses_the_provisioned_datasource() -> None:
    dash = load_dashboard()
    uid = provisioned_datasource()["uid"]
    refs = []
    for panel in query_panels(dash):
        refs.append(panel["datasource"])
        refs.extend(t["datasource"] for t in panel["targets"])
    refs.extend(v["datasource"] for v in variables(dash).values() if v["type"] == "query")
    assert refs
    for ref in refs:
        assert resolve_datasource_uid(dash, ref) == uid
