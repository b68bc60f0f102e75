"""Celery configuration: per-stage queues that do not leak into each other, and the
delivery guarantees the tasks rely on: late acks with redelivery when a worker dies, a
visibility timeout above every time limit, one message prefetched."""

from __future__ import annotations

import celeryconfig
from webctx.workers import celeryconfig as settings_module
from webctx.workers.app import app

STAGES = {"webctx.plan": "search", "webctx.search": "search", "webctx.fetch": "fetch",
          "webctx.embed": "embed", "webctx.embed_question": "embed", "webctx.store": "store",
          "webctx.rank": "rank"}


def test_each_stage_task_routes_to_its_own_queue_binding() -> None:
    queues = {q.name: q for q in settings_module.task_queues}
    bindings = {(q.exchange.name, q.routing_key) for q in queues.values()}
    assert len(bindings) == len(queues), "two queues share an exchange+key: messages duplicate"
    for task, queue in STAGES.items():
        route = app.amqp.router.route({}, task)
        assert route["queue"].name == queue
        assert (route["queue"].exchange.name, route["queue"].routing_key) == (queue, queue)


def test_index_search_reads_beside_rank_and_re_index_runs_have_their_queue() -> None:
    route = app.amqp.router.route
    assert route({}, "webctx.index.search")["queue"].name == "rank"
    for task in ("webctx.index.tick", "webctx.index.refresh", "webctx.index.forget"):
        assert route({}, task)["queue"].name == "reindex"


def test_tasks_are_acked_late_and_redelivered_when_the_worker_dies() -> None:
    conf = app.conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    vis = conf.broker_transport_options["visibility_timeout"]
    assert vis == conf.result_backend_transport_options["visibility_timeout"]
    assert vis > conf.task_time_limit > conf.task_soft_time_limit


def test_every_stage_task_is_registered() -> None:
    import webctx.workers.tasks  # noqa: F401

    assert set(STAGES) <= set(app.tasks)


def test_the_checkout_celeryconfig_reexports_the_installed_settings() -> None:
    names = [n for n in vars(settings_module) if not n.startswith("_") and n.islower()]
    assert "task_routes" in names and "broker_url" in names
    for name in names:
        assert getattr(celeryconfig, name) is getattr(settings_module, name), name
