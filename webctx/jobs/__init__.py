"""The job engine: job state in Redis, the fan-in between stages, batches, tenants (API
keys), staged vectors and the caches shared by jobs."""
