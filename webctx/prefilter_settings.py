"""The settings of the lexical first pass (WEBCTX_PREFILTER__<NAME>), a group of the one
Settings (`webctx.settings.Settings.prefilter`); the pass is webctx/stages/prefilter.py."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class PrefilterSettings(BaseModel):
    """The lexical first pass of a one-off job (WEBCTX_PREFILTER__<NAME>): only the chunks
    the ranker can reach are embedded before the bundle, the rest afterwards for the index
    (webctx.stages.prefilter; measured in docs/benchmarks.md)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    when: Literal["local", "always", "never"] = "local"
    """`local`: when the embedder runs in this process (the local model: every chunk costs
    CPU time); `always`: with an embeddings API too (fewer tokens for the same wait); `never`:
    every chunk of every page is embedded as its page arrives. Batch items' pages always are.
    Afterwards the pages are embedded and stored whole for the index (`webctx.index_later`,
    store queue, low priority; in the embedded default, by the local service)."""
    chunks: int = Field(default=768, ge=0)
    """The best chunks by BM25 over all the job's chunks."""
    per_page: int = Field(default=16, ge=0)
    """Each page's best chunks by BM25, besides."""
    neighbours: int = Field(default=256, ge=0)
    """The chunks next to this many of the best BM25 hits, besides. The defaults are the
    smallest selection measured that kept answer recall at every budget of both seeds
    (docs/benchmarks.md, `prefilter_recall`): ~900 of ~1,280 chunks of an 8-source job;
    512/8/128 (~620 chunks) was one question in 200 short at 500 tokens."""
    ahead: bool = True
    """Embed each page's chunks the pass is likely to select (its own first pass, with the job's
    limits shared out per source) into the embedding cache as the page arrives, while other pages
    download, so rank embeds only the rest. Stops once every page is in; needs the embedding
    cache (not with the hash embedder). The selection is unchanged: rank still selects over all
    the job's chunks (webctx.stages.ahead)."""
    embed_budget_s: float = Field(default=2.0, ge=0)
    """With the local model: the seconds rank may spend embedding the pass's chunks, at the
    speed (chunks a second) the model has shown in this process, measured when it loads and
    on every embedding since. A pass that would take longer is narrowed to fit: `chunks`,
    `per_page` and `neighbours` scaled down together; chunks already embedded while pages
    downloaded cost nothing and stay. 0: never narrowed. The default pass (~900 chunks of
    an 8-source job) fits at about 460 chunks a second (bf16 in hardware on an idle machine)
    and nothing changes; narrowed to 512-640 chunks, answer recall was one question in 200
    lower at 500 tokens, at the 256-chunk floor up to three (docs/benchmarks.md)."""
    min_chunks: int = Field(default=256, ge=0)
    """The narrowed pass embeds at least this many chunks, however slow the CPU."""
