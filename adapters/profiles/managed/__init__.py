"""Request/response mappings of the managed-endpoint schemes (``fortis.adapters.
managed_endpoints``; data only, a package so the files ship with the distribution)."""
