"""Loopback peers for tests, benchmarks and the offline demo: a web site, a
SearxNG-compatible search endpoint and an OpenAI-compatible embeddings endpoint."""
