"""Adapters for other frameworks' environments, each the loader of one `<source>:<name>`."""
