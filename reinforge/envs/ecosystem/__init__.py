"""Adapters that run other frameworks' environments as reinforge environments, each named
`<source>:<name>` through the entry-point group `reinforge.env_sources`."""
