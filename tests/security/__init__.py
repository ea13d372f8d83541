"""The security suite: a hostile tenant's probes (../shared/redteam-2026-12-04.md), each written from its
reproduction, together where a reader finds them."""
