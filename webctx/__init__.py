"""webctx: a research question in, a cited web-grounded context bundle out."""

__version__ = "0.1.0"
