"""Celery configuration: per-stage queues that do not leak into each other, and the
delivery guarantees the tasks rely on (TRAPS 1, 2, 5)."""

from __future__ import annotations

import celeryconfig
from workers.app import app

STAGES = {"webctx.plan": "search", "webctx.search": "search", "webctx.fetch": "fetch",
          "webctx.embed": "embed", "webctx.embed_question": "embed", "webctx.store": "store",
          "webctx.rank": "rank"}


def test_each_stage_task_routes_to_its_own_queue_binding() -> None:
    queues = {q.name: q for q in celeryconfig.task_queues}
    bindings = {(q.exchange.name, q.routing_key) for q in queues.values()}
    assert len(bindings) == len(queues), "two queues share an exchange+key: messages duplicate"
    for task, queue in STAGES.items():
        route = app.amqp.router.route({}, task)
        assert route["queue"].name == queue
        assert (route["queue"].exchange.name, route["queue"].routing_key) == (queue, queue)


def test_tasks_are_acked_late_and_redelivered_when_the_worker_dies() -> None:
    conf = app.conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    vis = conf.broker_transport_options["visibility_timeout"]
    assert vis == conf.result_backend_transport_options["visibility_timeout"]
    assert vis > conf.task_time_limit > conf.task_soft_time_limit


def test_every_stage_task_is_registered() -> None:
    import workers.tasks  # noqa: F401

    assert set(STAGES) <= set(app.tasks)
