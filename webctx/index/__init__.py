"""The persistent index: registered sources re-indexed on a schedule, each tenant's page
records and the generations a search sees, and hybrid search over them (docs/index.md)."""
