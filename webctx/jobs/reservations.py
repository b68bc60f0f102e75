"""What a job does with a publisher's opt-outs beyond robots.txt (`webctx.net.optouts`).

Honoured (WEBCTX_FETCH__OPT_OUTS=honour, the default): a page whose publisher reserved
it (`noai`, `none`, a TDM reservation) is refused with `OptedOut`, so it ends in the
job's failures as `opted_out` with the rule, and its text is neither stored, embedded
nor bundled. Reported (`report`, for operators with a licence): the page is used and
carries the rule (`Page.opt_out`), which its bundle source shows.

`noindex` does not refuse a page to a one-off job: that job's use is reading the page
for one answer, as a browser would, not indexing it; the page keeps the rule
(`Page.noindex`) and the persistent index never takes it in (`webctx.index.refresh`).
"""

from __future__ import annotations

from webctx.errors import OptedOut
from webctx.models import Download, Page
from webctx.net.optouts import OptOuts, page_opt_outs
from webctx.settings import FetchSettings


def download_opt_outs(settings: FetchSettings, download: Download, prior: Page | None) -> OptOuts:
    """The opt-outs of a download (a 304's: its headers, and the marks of the `prior`
    copy it confirms); raises OptedOut when the page is reserved and opt-outs are
    honoured."""
    found = page_opt_outs(download, settings.product_token)
    if download.status == 304 and prior is not None:
        found = OptOuts(found.reserved or prior.opt_out, found.noindex or prior.noindex)
    if found.reserved and settings.opt_outs == "honour":
        raise OptedOut(download.url, found.reserved)
    return found


def marked(page: Page, found: OptOuts) -> Page:
    """`page` carrying the opt-outs that did not refuse it."""
    if found.reserved == page.opt_out and found.noindex == page.noindex:
        return page
    return page.model_copy(update={"opt_out": found.reserved, "noindex": found.noindex})


def refused_copy(settings: FetchSettings, page: Page) -> bool:
    """A stored copy marked reserved (kept while opt-outs were reported) that a job may not
    use now they are honoured."""
    return page.opt_out is not None and settings.opt_outs == "honour"
