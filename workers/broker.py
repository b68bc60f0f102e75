"""kombu's Redis transport, fixed so a worker survives its broker restarting.

With celery/kombu 5.7 a worker that holds unacked messages (every worker with `acks_late`
mid-job, and any worker holding a job's deadline watchdog) dies with "Unrecoverable
error: AttributeError('NoneType' object has no attribute 'hostname')" when Redis goes
away: the consumer collects the lost connection (which drops the transport's client),
then closes it, and the channel's close tries to requeue its unacked messages through a
new connection pool built from that client. Measured in tests/integration/
test_durability.py: the worker exited and the job waited until the CLI's timeout.

Then a task received before the loss that ends after the reconnect kills it the same way
when it acks through its old channel. Neither the requeue at close nor that ack is
needed on Redis: each unacked message is also kept in the broker (`unacked` hash) and
comes back after the visibility timeout, as any unacked message does, while the task may
still be running in this process (a thread cannot be cancelled). So once the connection
has been collected, this channel leaves its messages to that sweep.

It also reuses one synchronous Redis client per channel (see `_Channel._create_client`),
and, in a worker, records each message it holds unacked under the worker's holder id, so
that other workers requeue them within a minute when this one dies (webctx/workers/
liveness.py) instead of after the visibility timeout.
"""

from __future__ import annotations

from time import time
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps

from webctx.workers import liveness


class _QoS(kombu_redis.QoS):
    def append(self, message: Any, delivery_tag: str) -> None:
        """kombu's append (the message into `unacked`), plus the tag into this worker's held
        set in the same pipeline: a tag is never in one without the other."""
        delivery = message.delivery_info
        entry = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        with self.pipe_or_acquire() as pipe:
            pipe.zadd(self.unacked_index_key, {delivery_tag: time()})
            pipe.hset(self.unacked_key, delivery_tag, entry)
            if liveness.recording():
                held = liveness.held_key(liveness.WORKER_ID)
                pipe.sadd(held, delivery_tag).expire(held, liveness.HELD_TTL_S)
            pipe.execute()
        virtual.QoS.append(self, message, delivery_tag)

    def _remove_from_indices(self, delivery_tag: str, pipe: Any = None) -> Any:
        # Every way out of `unacked` (ack, reject, restore) goes through here.
        pipe = super()._remove_from_indices(delivery_tag, pipe)
        if liveness.recording():
            pipe.srem(liveness.held_key(liveness.WORKER_ID), delivery_tag)
        return pipe

    def _collected(self) -> bool:
        """True once the consumer dropped this channel's connection (the broker was lost)."""
        transport = self.channel.connection
        return transport is None or transport.client is None

    def restore_unacked(self, client: Any = None) -> Any:
        if self._collected():
            self._delivered.clear()  # still in Redis' unacked hash: the sweep requeues them
            return None
        return super().restore_unacked(client)

    def ack(self, delivery_tag: str) -> None:
        # A task received before the connection was lost ends after the reconnect: its
        # message stays unacked and is redelivered after the visibility timeout, where
        # the (idempotent) task finds its work done.
        if not self._collected():
            super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if not self._collected():
            super().reject(delivery_tag, requeue=requeue)


class _Channel(kombu_redis.Channel):
    QoS = _QoS
    _sync_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        """One synchronous client per channel and pool, instead of kombu's new `redis.Redis`
        for every publish and ack (`conn_or_acquire`): building one (its table of response
        callbacks) cost 0.17 ms, about 80 times per research job on a worker. A client is
        safe to share between threads: each command takes a connection from the pool. The
        polling client (`asynchronous`) stays kombu's own."""
        if asynchronous:
            return super()._create_client(asynchronous=True)
        client = self._sync_client
        if client is None or client.connection_pool is not self.pool:
            client = self._sync_client = super()._create_client()
        return client


class RedisTransport(kombu_redis.Transport):
    """`redis://` broker transport whose workers reconnect after a Redis restart."""

    Channel = _Channel
