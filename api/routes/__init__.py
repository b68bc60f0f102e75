"""HTTP routes of the jobs API: jobs, the synchronous context call, health."""
