"""The network guard: which addresses and TCP ports a fetch may reach, how the fetcher
treats the sites it visits (robots.txt, pace, pauses), and the provider rate limiter
(docs/security.md)."""
